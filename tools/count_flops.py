#!/usr/bin/env python
"""Parameters, GFLOPs (fvcore multiply-adds, attention matmuls included) and effective depth
of SR-ViT variants, as in the paper's Table 2.

    python tools/count_flops.py                      # every variant at 224x224
    python tools/count_flops.py --size 512 --models srvit_s_t3 srvit_deit_s
    python tools/count_flops.py --num-classes 0 --size 1024   # backbone only
"""
import argparse
import json
import sys

import timm
import torch

import srvit_backbones  # noqa: F401  (registers the variants with timm)
from srvit_backbones.flops import count_flops, count_params
from srvit_backbones.models import VARIANTS


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(VARIANTS), help="variant names")
    parser.add_argument("--size", type=int, nargs="+", default=[224], help="input size: S or H W")
    parser.add_argument("--num-classes", type=int, default=1000, help="classifier size (0: backbone only)")
    parser.add_argument("--json", help="also write the table to this JSON file")
    return parser.parse_args(argv)


def measure(name, size, num_classes):
    model = timm.create_model(name, num_classes=num_classes, img_size=size)
    x = torch.randn(1, 3, *size)
    return dict(model=name, T=model.num_steps, d_eff=model.effective_depth,
                params_m=count_params(model) / 1e6, gflops=count_flops(model, (x,)) / 1e9,
                input=f"{size[0]}x{size[1]}")


def main(argv=None):
    args = parse_args(argv)
    if len(args.size) not in (1, 2):
        sys.exit("--size takes one (square) or two (H W) values")
    size = tuple(args.size) * (2 // len(args.size))
    for name in args.models:
        if name not in VARIANTS:
            sys.exit(f"unknown model {name!r}; known: {', '.join(VARIANTS)}")
    rows = [measure(name, size, args.num_classes) for name in args.models]
    print(f"{'model':<14} {'T':>2} {'D_eff':>5} {'params (M)':>10} {'GFLOPs':>8}  input")
    for r in rows:
        print(f"{r['model']:<14} {r['T']:>2} {r['d_eff']:>5} {r['params_m']:>10.3f} {r['gflops']:>8.2f}  {r['input']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
