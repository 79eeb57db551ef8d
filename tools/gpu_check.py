#!/usr/bin/env python
"""The GPU check (``make gpu-check``): what a GPU user's run does, in one command and one JSON,
each figure beside its anchor measured in the same run.

    python tools/gpu_check.py                                   # one GPU
    python tools/gpu_check.py --device cpu --size 64 --steps 1 --checks a b c d e f g --compile-backend aot_eager

The checks (a)-(g), what each runs and reads against: ``srvit_backbones.analysis.benchmark.gpu_check``.
"""
import argparse
import functools
import json
import os
import sys

import torch

from srvit_backbones.analysis.benchmark.gpu_check import CHECKS, run_checks, summary
from srvit_backbones.analysis.benchmark.runner import COMPILE_BACKENDS


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", help="default: cuda when a GPU is visible, else (e) only on the CPU")
    p.add_argument("--checks", nargs="+", choices=sorted(CHECKS), help="default: all on CUDA, e elsewhere")
    p.add_argument("--size", type=int, default=1024,
                   help="detector and windowed backbone input (mmseg: min(size, 512), pretraining 224)")
    p.add_argument("--images-per-gpu", type=int, default=1,
                   help="detector images per step (ViTDet: 1 per GPU); twice that for mmseg and the backbones")
    p.add_argument("--throughput-size", type=int, default=224, help="(d), (g): input size of the throughput runs")
    p.add_argument("--throughput-batch", type=int, default=64, help="(d), (g) at --throughput-size: images per batch")
    p.add_argument("--backbone", default="srvit_s_t3", help="(f), (g): the SR-ViT variant timed")
    p.add_argument("--compile-backend", default="inductor", choices=COMPILE_BACKENDS,
                   help="(g): torch.compile's backend (aot_eager: dynamo and autograd's graphs without inductor, "
                        "a quick CPU run)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per check")
    p.add_argument("--steps", type=int, default=5, help="timed steps per check")
    p.add_argument("--no-amp", dest="pretrain_amp", action="store_false",
                   help="(c), (d) and (g) in fp32 (on a CPU without native bf16)")
    p.add_argument("--no-peak-memory", dest="peak_memory", action="store_false",
                   help="(d), (f), (g): no peak-memory process per model (quicker; their memory figures empty)")
    p.add_argument("--output", default="output/gpu_check.json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.device is None:
        args.device = "cuda" if cuda else "cpu"
        if not cuda:
            print("gpu_check: no CUDA device here; running (e) only, the GPU's kernel and block choices forced on "
                  "the CPU. Run it on a GPU machine for (a)-(g).")
            args.checks = args.checks or ["e"]
    device = torch.device(args.device)
    if device.type == "cuda" and not cuda:
        sys.exit("gpu_check: --device cuda but no GPU is visible: drop --device to run (e) on the CPU")
    command = " ".join(["tools/gpu_check.py"] + (argv if argv is not None else sys.argv[1:]))
    result = run_checks(args.checks or sorted(CHECKS), args, device, command, functools.partial(print, flush=True))
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(json.dumps(summary(result), indent=1, default=str))
    print(f"gpu_check: wrote {args.output}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
