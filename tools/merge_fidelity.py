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
and the last block's output.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from srvit_backbones import create_srvit, load_pretrained
from srvit_backbones.export import parse_override

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def find_images(inputs):
    paths = []
    for item in inputs:
        if os.path.isdir(item):
            paths += sorted(p for p in glob.glob(os.path.join(item, "*")) if p.lower().endswith(IMAGE_EXTENSIONS))
        else:
            paths += sorted(glob.glob(item))
    if not paths:
        raise SystemExit(f"no images found in {inputs}: give image files, globs or folders ({', '.join(IMAGE_EXTENSIONS)})")
    return paths


def load_batch(path, size):
    image = Image.open(path).convert("RGB").resize((size, size), Image.BICUBIC)
    x = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float().div(255)
    mean, std = torch.tensor(IMAGENET_DEFAULT_MEAN), torch.tensor(IMAGENET_DEFAULT_STD)
    return ((x - mean[:, None, None]) / std[:, None, None])[None]


@torch.no_grad()
def fidelity(model, images, ratios):
    """{ratio: {feature: {"cosine": mean per-token cosine, "cosine_min": lowest image mean,
    "rel_l2": ||merged - ref|| / ||ref||}}}, averaged over ``images`` (each (1, 3, H, W))."""
    results = {}
    for ratio in ratios:
        sums = {}
        for x in images:
            model.set_token_merge_ratio(0.0)
            reference = model.forward_feature_maps(x)
            model.set_token_merge_ratio(ratio)
            merged = model.forward_feature_maps(x)
            for key, ref in reference.items():
                cosine = F.cosine_similarity(merged[key], ref, dim=1).mean().item()
                rel = ((merged[key] - ref).norm() / ref.norm()).item()
                sums.setdefault(key, []).append((cosine, rel))
        results[ratio] = {key: dict(cosine=float(np.mean([c for c, _ in v])), cosine_min=min(c for c, _ in v),
                                    rel_l2=float(np.mean([r for _, r in v]))) for key, v in sums.items()}
    model.set_token_merge_ratio(0.0)
    return results


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
    kwargs = dict(args.set)
    kwargs.setdefault("img_size", args.size)
    model = create_srvit(args.model, num_classes=0, **kwargs).eval()
    # the dense features are taken before the final norm, which detector checkpoints lack
    report = load_pretrained(model, args.checkpoint, allow_partial=True)
    missing = [k for k in report.required_missing if not k.startswith("norm.")]
    if missing:
        raise SystemExit(f"{args.checkpoint} does not fit {args.model}: {len(missing)} backbone tensors are missing, "
                         f"e.g. {missing[:3]}; pass the variant (and --set overrides) it was trained with")
    paths = find_images(args.input)[:args.max_images]
    results = fidelity(model, [load_batch(p, args.size) for p in paths], args.ratios)
    print(f"{args.model} from {args.checkpoint}, {len(paths)} images at {args.size}x{args.size}")
    print("| ratio | feature | cosine (mean) | cosine (worst image) | relative L2 |\n|---|---|---|---|---|")
    for ratio, feats in results.items():
        for key, r in feats.items():
            print(f"| {ratio} | {key} | {r['cosine']:.4f} | {r['cosine_min']:.4f} | {r['rel_l2']:.4f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command=" ".join(sys.argv), images=paths, results=results), f, indent=1)
    return results


if __name__ == "__main__":
    main()
