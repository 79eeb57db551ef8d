#!/usr/bin/env python
"""Pictures of the soft router on real images, in the style of the paper's Figure 4. For every
recursive unit with a router: the step each token weights most (argmax) and how undecided the
router is (the mixture's entropy / log T: 0 = all weight on one step, 1 = uniform), overlaid
on the image, and the mean weight per step over the tokens. One PNG per image, and
summary.png: the mean weight per step over all tokens of all images.

    python tools/visualize_mixture.py --model srvit_s_t3 --checkpoint output/pretrain/last.pth --input photos/
    python tools/visualize_mixture.py --model srvit_s_t3 --checkpoint output/model_final.pth \\
        --input 'val2017/*.jpg' --size 512 --keep-aspect --out-dir mixture_det
    python tools/visualize_mixture.py --model srvit_s_t3 --checkpoint work_dirs/upernet_srvit_s/iter_160000.pth \\
        --input photo.jpg --amp

--checkpoint: a tools/pretrain.py checkpoint, a detectron2 model_final.pth or an mmseg
iter_N.pth; the backbone is found inside it. --model (and --set) must name the variant it
was trained as; a checkpoint of another width or T is refused with the reason. The model is
built with the checkpoint's position table, resized to each input as the frameworks do.
Without --input: scikit-image's astronaut photo. Without --checkpoint: a random model (router
initialised non-zero so that the maps vary), whose pictures mean nothing. With 'hard'
aggregation the applied weights are one-hot: the entropy is 0 everywhere.
"""
import argparse
import sys

from srvit_backbones.analysis.export import parse_override
from srvit_backbones.analysis.images import find_images
from srvit_backbones.analysis.mixture_pictures import (
    build_model,
    describe_image,
    describe_summary,
    draw_pictures,
    draw_summary,
    picture_names,
)
from srvit_backbones.errors import tool_main


@tool_main(prefix="error: ")
def main(argv=None):
    """Returns the per-image statistics (``images``: path, png, size, units) and the summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="srvit_s_t3", help="SR-ViT variant the checkpoint was trained as")
    parser.add_argument("--checkpoint", default="", help="tools/pretrain.py, detectron2 or mmseg checkpoint "
                                                         "(default: a random model)")
    parser.add_argument("--ema", action="store_true", help="take a pretraining checkpoint's EMA weights")
    parser.add_argument("--set", dest="overrides", type=parse_override, nargs="+", default=[], metavar="KEY=VALUE",
                        help="model arguments, as for timm.create_model (e.g. num_steps=4 embed_dim=32)")
    parser.add_argument("--input", default="", help="an image, a folder of images or a glob pattern "
                                                    "(default: scikit-image's astronaut photo)")
    parser.add_argument("--size", type=int, default=224, help="input size, a multiple of 16 (default 224)")
    parser.add_argument("--keep-aspect", action="store_true",
                        help="resize the short side to --size and keep the aspect ratio")
    parser.add_argument("--out-dir", default="mixture", help="folder for the PNGs (default: mixture)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast on a CPU with native bf16, fp16 on CUDA "
                                                           "(the router's softmax stays fp32)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args(argv)
    paths = find_images([args.input], recursive=False) if args.input else [None]
    names = picture_names(paths)
    model, units, report = build_model(args.model, args.overrides, args.checkpoint, args.ema, args.size, args.amp,
                                       args.device)
    if report is None:
        print("warning: no --checkpoint: a random model (router initialised non-zero); these pictures show the "
              "tool working, not what a trained router does", file=sys.stderr)
    else:
        print(f"weights: {args.checkpoint}\n{report.summary()}")
    images = []
    for image in draw_pictures(model, units, paths, names, args.size, args.keep_aspect, args.out_dir, args.amp,
                               args.device):
        images.append(image)
        print(f"wrote {image['png']}: {describe_image(image)}")
    summary, summary_png, tokens = draw_summary(model, images, args.out_dir)
    print(f"wrote {summary_png}: {len(paths)} image(s), {tokens} tokens")
    print(describe_summary(model, summary))
    return dict(images=images, summary=summary, summary_png=summary_png)


if __name__ == "__main__":
    main()
