#!/usr/bin/env python
"""Convert a checkpoint into a plain SR-ViT backbone state dict.

Detectron2 (train.init_checkpoint) and MMSegmentation (init_cfg Pretrained) load
tools/pretrain.py checkpoints and timm DeiT state dicts directly; this tool is for the rest:
picking EMA weights, pre-resizing the position embedding, dropping the head, and re-saving
checkpoints that hold Python objects (``--trust``) as weights only.

    python tools/convert_checkpoint.py output/pretrain/best.pth srvit_s_t3_in1k.pth --model srvit_s_t3 --ema
    python tools/convert_checkpoint.py deit_small.pth deit_s_1024.pth --model srvit_deit_s --img-size 1024
"""
import argparse

import torch

from srvit_backbones import create_srvit, load_pretrained
from srvit_backbones.checkpoint import CheckpointError, read_checkpoint


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--model", required=True, help="the SR-ViT variant the weights belong to")
    parser.add_argument("--img-size", type=int, default=224, help="position-embedding table size to write")
    parser.add_argument("--ema", action="store_true", help="take the EMA weights when present")
    parser.add_argument("--prefix", default=None,
                        help="take the weights under this key prefix (default: found by the patch embedding)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="write the file even if backbone weights are missing (they keep their initialisation)")
    parser.add_argument("--trust", action="store_true",
                        help="load with weights_only=False (only for files you trust)")
    args = parser.parse_args(argv)
    try:
        obj = torch.load(args.src, map_location="cpu", weights_only=False) if args.trust else read_checkpoint(args.src)
        model = create_srvit(args.model, num_classes=0, global_pool="", img_size=args.img_size)
        report = load_pretrained(model, obj, prefer_ema=args.ema, allow_partial=args.allow_missing,
                                 prefix=args.prefix)
    except CheckpointError as e:
        raise SystemExit(f"error: {e}\nnothing was written (--allow-missing writes an incomplete file)") from None
    print(report.summary())
    torch.save({"model": model.state_dict(), "variant": args.model}, args.dst)
    print(f"wrote {args.dst} ({args.model}, {args.img_size}x{args.img_size} position table, no head)")
    return report


if __name__ == "__main__":
    main()
