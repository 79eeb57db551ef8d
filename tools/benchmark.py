#!/usr/bin/env python
"""Speed and memory of SR-ViT against timm's ViT of the same width and depth = D_eff (the
physical reference: same number of block applications) and timm's DeiT-S / DeiT-B.

    python tools/benchmark.py --model srvit_s_t3 --size 224 --batch-size 8
    python tools/benchmark.py --model srvit_s_t4 --size 1024 --batch-size 1 --modes train \\
        --grad-checkpointing both --json docs/bench_s_t4_1024.json

Every measurement runs in its own process (so CPU peak resident memory is that model's),
with warm-up iterations and several timed repeats; the table shows the median and the
spread (min-max), and --json writes it all with the exact command.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import timm
import torch

import srvit_backbones  # noqa: F401
from srvit_backbones.models import VARIANTS


def build(kind, name, size, grad_ckpt):
    num_classes = 1000 if size == 224 else 0
    if kind == "srvit":
        model = timm.create_model(name, img_size=size, num_classes=num_classes)
    elif kind == "vit_same_depth":
        ref = timm.create_model(name, img_size=size, num_classes=0)
        model = timm.models.vision_transformer.VisionTransformer(
            img_size=size, patch_size=16, embed_dim=ref.embed_dim, depth=ref.effective_depth,
            num_heads=ref.units[0].blocks[0].attn.num_heads, num_classes=num_classes)
    else:
        model = timm.create_model(name, img_size=size, num_classes=num_classes)
    model.set_grad_checkpointing(grad_ckpt)
    return model


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def worker(args):
    device = torch.device(args.device)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = build(args.kind, args.name, args.size, args.grad_checkpointing).to(device)
    x = torch.randn(args.batch_size, 3, args.size, args.size, device=device)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and args.amp else torch.autocast(
        "cpu", enabled=False)
    if args.mode == "infer":
        model.eval()

        def step():
            with torch.inference_mode(), amp:
                model(x)
    else:
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            with amp:
                out = model(x)
            out.float().square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        step()
    sync(device)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2 ** 20
        peak_kind = "cuda_max_allocated_mib"
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        peak_kind = "cpu_peak_rss_growth_mib"
    print(json.dumps(dict(kind=args.kind, name=args.name, mode=args.mode, grad_checkpointing=args.grad_checkpointing,
                          size=args.size, batch_size=args.batch_size, times_s=times,
                          median_s=statistics.median(times), min_s=min(times), max_s=max(times),
                          img_per_s=args.batch_size / statistics.median(times), peak_mib=peak, peak_kind=peak_kind,
                          params_m=sum(p.numel() for p in model.parameters()) / 1e6)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="srvit_s_t3", help="SR-ViT variant")
    p.add_argument("--size", type=int, default=224, help="224 (classification), 512 (seg), 1024 (det)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--modes", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    p.add_argument("--grad-checkpointing", choices=["off", "on", "both"], default="off")
    p.add_argument("--references", nargs="*", default=["vit_same_depth", "deit_small_patch16_224",
                                                        "deit_base_patch16_224"],
                   help="vit_same_depth and/or timm model names")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", action="store_true", help="bf16 autocast on the GPU")
    p.add_argument("--json", help="write results here")
    # internal: one measurement per process
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kind", help=argparse.SUPPRESS)
    p.add_argument("--name", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        args.grad_checkpointing = args.grad_checkpointing == "on"
        return worker(args)
    if args.model not in VARIANTS:
        sys.exit(f"unknown model {args.model!r}; known: {', '.join(VARIANTS)}")
    if args.size % 16:
        sys.exit(f"--size {args.size} is not a multiple of the patch size 16")
    ckpt_modes = {"off": ["off"], "on": ["on"], "both": ["off", "on"]}[args.grad_checkpointing]
    jobs = [("srvit", args.model)] + [("vit_same_depth" if r == "vit_same_depth" else "timm",
                                        args.model if r == "vit_same_depth" else r) for r in args.references]
    rows = []
    for mode in args.modes:
        for kind, name in jobs:
            for ck in (ckpt_modes if mode == "train" else ["off"]):
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--kind", kind, "--name", name,
                       "--mode", mode, "--size", str(args.size), "--batch-size", str(args.batch_size),
                       "--warmup", str(args.warmup), "--repeats", str(args.repeats), "--device", args.device,
                       "--grad-checkpointing", ck] + (["--amp"] if args.amp else [])
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"measurement failed ({kind} {name} {mode}):\n{out.stderr[-2000:]}")
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    label = {"srvit": lambda r: r["name"], "vit_same_depth": lambda r: f"timm ViT depth={_deff(r['name'])}",
             "timm": lambda r: r["name"]}
    print(f"{'model':<26} {'mode':<5} {'ckpt':<4} {'median s':>9} {'spread s':>15} {'img/s':>8} {'peak MiB':>9}")
    for r in rows:
        print(f"{label[r['kind']](r):<26} {r['mode']:<5} {'on' if r['grad_checkpointing'] else 'off':<4} "
              f"{r['median_s']:>9.4f} {r['min_s']:>7.4f}-{r['max_s']:<7.4f} {r['img_per_s']:>8.2f} {r['peak_mib']:>9.0f}")
    result = dict(command=" ".join([os.path.relpath(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
                  machine=dict(platform=platform.platform(), processor=platform.processor(), cpus=os.cpu_count(),
                               torch=torch.__version__, device=args.device,
                               gpu=torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None),
                  rows=rows)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def _deff(name):
    return timm.create_model(name, num_classes=0, img_size=32).effective_depth


if __name__ == "__main__":
    main()
