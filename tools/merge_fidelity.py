#!/usr/bin/env python
"""How much token merging changes a trained backbone's dense features: for each merge ratio,
the cosine similarity between every feature map of the merged and the unmerged model, per
token (a stride-16 feature vector), averaged over the tokens and images; plus the relative
L2 error. Run it on your checkpoint and your images before turning merging on.

    python tools/merge_fidelity.py --model srvit_s_t3 --checkpoint output/pretrain/best.pth \\
        --input images/ --size 512 --ratios 0.25 0.5
    python tools/merge_fidelity.py --model srvit_t_t2 --set embed_dim=64 num_heads=2 img_size=192 \\
        --checkpoint output/quickstart_detectron2/model_final.pth --input datasets/coco/val2017 --size 192

The checkpoint may come from tools/pretrain.py, detectron2 or mmseg (the backbone is found
inside it); the features are those dense heads take by default (``default_feature_indices``)
and the last block's output. The computation is ``srvit_backbones.analysis.merge_fidelity``.
"""
import argparse
import json
import sys

from srvit_backbones.analysis.export import parse_override
from srvit_backbones.analysis.images import find_images, load_image, to_batch
from srvit_backbones.analysis.merge_fidelity import fidelity, fidelity_model, fidelity_table
from srvit_backbones.errors import tool_main


@tool_main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="variant, e.g. srvit_s_t3")
    parser.add_argument("--set", nargs="*", default=[], type=parse_override, metavar="KEY=VALUE",
                        help="model arguments, as for timm.create_model (e.g. embed_dim=64 num_heads=2)")
    parser.add_argument("--checkpoint", required=True, help="weights: pretraining, detectron2 or mmseg checkpoint")
    parser.add_argument("--input", nargs="+", required=True, help="images, globs or folders")
    parser.add_argument("--size", type=int, default=224, help="square input size (a multiple of 16)")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5])
    parser.add_argument("--max-images", type=int, default=32)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.size % 16:
        parser.error(f"--size {args.size} is not a multiple of the patch size 16")
    model = fidelity_model(args.model, args.set, args.checkpoint, args.size)
    paths = find_images(args.input, recursive=False)[:args.max_images]
    results = fidelity(model, [to_batch(load_image(p, args.size)) for p in paths], args.ratios)
    print(f"{args.model} from {args.checkpoint}, {len(paths)} images at {args.size}x{args.size}")
    print(fidelity_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command=" ".join(sys.argv), images=paths, results=results), f, indent=1)
    return results


if __name__ == "__main__":
    main()
