#!/usr/bin/env python
"""Speed and memory of SR-ViT against timm's ViT of the same width and depth = D_eff (the
physical reference: same number of block applications) and timm's DeiT-S / DeiT-B.

    python tools/benchmark.py --model srvit_s_t3 --size 224 --batch-size 8
    python tools/benchmark.py --model srvit_s_t4 --size 1024 --batch-size 1 --modes train \\
        --grad-checkpointing both --references --json docs/bench_s_t4_1024.json

Timing: all models of a mode are built in one process and warmed up; then the timed
repeats are interleaved: in every round each model runs one step in turn, in alternating
order (A B C, C B A, ...). Compared models are timed seconds apart and share one allocator
and one set of threads, so a machine whose speed drifts (shared VMs, GPU clocks) shifts them
alike; per-round paired time ratios are reported with a bootstrap 95% interval. (Separate
processes per model were tried first: on a shared 2-core VM they differed systematically by
more than 5%, more than the differences being measured.)
On Linux/glibc the timing process keeps freed memory (see ``keep_freed_memory``): otherwise
a step's activations can be handed back to the kernel and faulted in again, which costs time
and scatters it.
Peak memory: each model in a process of its own (CPU: growth of the peak resident set,
parameters and AdamW state included; GPU: max allocated), so the figure is that model's alone.
The table shows medians and spreads (min-max); --json writes every repeat and the command.
"""
import argparse
import ctypes
import functools
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time

import timm
import torch

import srvit_backbones  # noqa: F401  (registers the SR-ViT variants)
from srvit_backbones.models import VARIANTS

REFERENCE_SAME_DEPTH = "vit_same_depth"


# ---------------------------------------------------------------- the timing process
def keep_freed_memory():
    """Make glibc malloc keep freed memory for reuse instead of returning it to the kernel.

    By default glibc serves the large activation buffers with mmap (or trims the heap) and
    unmaps them on free, so a step can fault its activations in again: on the 2-vCPU CI VM a
    plain inference loop over the depth-32 ViT (224px, batch 8) took ~50k page faults and
    ~15% system time per step, and in the four-model run DeiT-B faulted 430 MiB every step.
    This is what PyTorch's CPU performance guide gets from jemalloc/tcmalloc. Returns
    the settings made, or None where the C library is not glibc (then nothing changes).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    settings = {"M_MMAP_THRESHOLD": (-3, 32 * 2 ** 20), "M_TRIM_THRESHOLD": (-1, 2 ** 31 - 1)}
    if not all(mallopt(param, value) == 1 for param, value in settings.values()):
        return None
    return {name: value for name, (_, value) in settings.items()}


def minor_page_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# ---------------------------------------------------------------- models and their steps
def build(kind, name, size, grad_ckpt):
    num_classes = 1000 if size == 224 else 0
    if kind == REFERENCE_SAME_DEPTH:
        ref = timm.create_model(name, img_size=size, num_classes=0)
        model = timm.models.vision_transformer.VisionTransformer(
            img_size=size, patch_size=16, embed_dim=ref.embed_dim, depth=ref.effective_depth,
            num_heads=ref.units[0].blocks[0].attn.num_heads, num_classes=num_classes)
    else:
        model = timm.create_model(name, img_size=size, num_classes=num_classes)
    model.set_grad_checkpointing(grad_ckpt)
    return model


def make_step(model, args, mode, device):
    x = torch.randn(args.batch_size, 3, args.size, args.size, device=device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)
    if mode == "infer":
        model.eval()

        def step():
            with torch.inference_mode(), amp:
                model(x)
        return step
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with amp:
            out = model(x)
        out.float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def time_interleaved(jobs, args, device):
    """Build every job's model in this process and warm each up; then run ``args.repeats``
    rounds of one step per model, alternating the order every round (A B C, C B A, ...)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    steps, params_m = [], []
    for job in jobs:
        model = build(job["kind"], job["name"], args.size, job["grad_checkpointing"]).to(device)
        steps.append(make_step(model, args, job["mode"], device))
        params_m.append(sum(p.numel() for p in model.parameters()) / 1e6)
        for _ in range(args.warmup):
            steps[-1]()
        sync()
    times = [[] for _ in jobs]
    started = [[] for _ in jobs]
    faults = [[] for _ in jobs]
    for r in range(args.repeats):
        for i in (range(len(jobs)) if r % 2 == 0 else reversed(range(len(jobs)))):
            f0 = minor_page_faults()
            t0 = time.perf_counter()
            started[i].append(t0)
            steps[i]()
            sync()
            times[i].append(time.perf_counter() - t0)
            faults[i].append(minor_page_faults() - f0)
    rows = []
    for job, n, t, s, f in zip(jobs, params_m, times, started, faults):
        rows.append(dict(job, params_m=n, size=args.size, batch_size=args.batch_size, amp=args.amp, times_s=t, step_started=s,
                         median_s=statistics.median(t), min_s=min(t), max_s=max(t),
                         img_per_s=args.batch_size / statistics.median(t), minor_page_faults=f))
    return rows


def peak_memory_worker(args):
    """In a process of its own: build, run two steps (the second one with the optimizer state
    that the first created), print the peak memory."""
    device = torch.device(args.device)
    rss_before = peak_rss_mib()
    model = build(args.kind, args.name, args.size, args.grad_checkpointing).to(device)
    step = make_step(model, args, args.mode, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        print(json.dumps(dict(peak_mib=torch.cuda.max_memory_allocated() / 2 ** 20, peak_kind="cuda_max_allocated_mib")))
    else:
        growth = peak_rss_mib() - rss_before
        print(json.dumps(dict(peak_mib=growth, peak_kind="cpu_peak_rss_growth_mib")))


def peak_rss_mib():
    """This process's peak resident set (Linux VmHWM). Not getrusage's ru_maxrss: Linux carries
    that across exec, so a child started by a large parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2 ** 20 if sys.platform == "darwin" else 1024)


def measure_peak_memory(job, args):
    argv = [sys.executable, os.path.abspath(__file__), "--memory-worker", "--kind", job["kind"],
            "--name", job["name"], "--mode", job["mode"],
            "--grad-checkpointing", "on" if job["grad_checkpointing"] else "off", "--size", str(args.size),
            "--batch-size", str(args.batch_size), "--device", args.device]
    out = subprocess.run(argv + (["--amp"] if args.amp else []), capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"peak-memory measurement failed ({label(job)}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def label(row):
    name = f"timm ViT depth={_deff(row['name'])}" if row["kind"] == REFERENCE_SAME_DEPTH else row["name"]
    return f"{name} {row['mode']}" + (" ckpt" if row["grad_checkpointing"] else "")


@functools.lru_cache(maxsize=None)
def _deff(name):
    return timm.create_model(name, num_classes=0, img_size=32).effective_depth


def paired_ratio(a, b):
    """Time ratio a/b from the per-round ratios (same round = measured seconds apart): their
    median with a bootstrap 95% interval, and the ratio of the best (minimum) times, which
    estimates the undisturbed cost when interference only ever slows a step down."""
    ratios = [ta / tb for ta, tb in zip(a["times_s"], b["times_s"])]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return dict(a=label(a), b=label(b), time_ratios=ratios, median=statistics.median(ratios),
                ci95=(medians[49], medians[1949]), min=min(ratios), max=max(ratios),
                best_ratio=a["min_s"] / b["min_s"],
                peak_ratio=a["peak_mib"] / b["peak_mib"] if b["peak_mib"] else None)


def comparisons(rows):
    """SR-ViT against every reference in the same mode and checkpointing setting, and, in
    training, SR-ViT with checkpointing against SR-ViT without it."""
    out = []
    for s in (r for r in rows if r["kind"] == "srvit"):
        for ref in rows:
            if ref["kind"] != "srvit" and ref["mode"] == s["mode"] and ref["grad_checkpointing"] == s["grad_checkpointing"]:
                out.append(paired_ratio(s, ref))
        if s["grad_checkpointing"]:
            plain = [r for r in rows if r["kind"] == "srvit" and r["mode"] == s["mode"] and not r["grad_checkpointing"]]
            out.extend(paired_ratio(s, p) for p in plain)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="srvit_s_t3", help="SR-ViT variant")
    p.add_argument("--size", type=int, default=224, help="224 (classification), 512 (seg), 1024 (det)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--modes", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    p.add_argument("--grad-checkpointing", choices=["off", "on", "both"], default="off",
                   help="activation checkpointing in the training step")
    p.add_argument("--references", nargs="*", default=[REFERENCE_SAME_DEPTH, "deit_small_patch16_224",
                                                        "deit_base_patch16_224"],
                   help=f"{REFERENCE_SAME_DEPTH} and/or timm model names; empty: SR-ViT alone")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (one step per model each)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    p.add_argument("--json", help="write results here")
    p.add_argument("--default-malloc", action="store_true",
                   help="time with the C library's default allocator settings (see keep_freed_memory)")
    # internal: the peak-memory process of one model
    p.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kind", help=argparse.SUPPRESS)
    p.add_argument("--name", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def check_args(args):
    errors = []
    if args.model not in VARIANTS:
        errors.append(f"unknown --model {args.model!r}; known: {', '.join(VARIANTS)}")
    if args.size < 16 or args.size % 16:
        errors.append(f"--size {args.size} is not a positive multiple of the patch size 16")
    if args.batch_size < 1 or args.warmup < 0 or args.repeats < 1:
        errors.append("--batch-size and --repeats must be >= 1, --warmup >= 0")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        errors.append(f"--device {args.device}: CUDA is not available here; use --device cpu")
    for ref in args.references:
        if ref != REFERENCE_SAME_DEPTH and not timm.is_model(ref):
            errors.append(f"--references {ref!r} is neither {REFERENCE_SAME_DEPTH} nor a timm model name")
    if errors:
        sys.exit("benchmark: " + "; ".join(errors))


def main(argv=None):
    args = parse_args(argv)
    if args.memory_worker:
        args.grad_checkpointing = args.grad_checkpointing == "on"
        return peak_memory_worker(args)
    check_args(args)
    torch.manual_seed(0)
    ckpt = {"off": [False], "on": [True], "both": [False, True]}[args.grad_checkpointing]
    models = [("srvit", args.model)] + [(REFERENCE_SAME_DEPTH, args.model) if r == REFERENCE_SAME_DEPTH
                                        else ("timm", r) for r in args.references]
    malloc = None if args.default_malloc else keep_freed_memory()
    rows = []
    for mode in args.modes:
        jobs = [dict(kind=kind, name=name, mode=mode, grad_checkpointing=c)
                for kind, name in models for c in (ckpt if mode == "train" else [False])]
        peaks = [measure_peak_memory(job, args) for job in jobs]
        for row, peak in zip(time_interleaved(jobs, args, torch.device(args.device)), peaks):
            rows.append(dict(row, **peak))
    ratios = comparisons(rows)
    report(rows, ratios)
    result = dict(command=" ".join([os.path.relpath(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
                  machine=dict(platform=platform.platform(), processor=cpu_name(), cpus=os.cpu_count(),
                               torch_threads=torch.get_num_threads(), torch=torch.__version__, timm=timm.__version__,
                               device=args.device,
                               gpu=torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None),
                  method=dict(time="interleaved rounds in one process", malloc=malloc or "default",
                              peak_memory="one process per model, default allocator"),
                  rows=rows, comparisons=ratios)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def report(rows, ratios):
    print(f"{'model':<34} {'median s':>9} {'spread s':>17} {'img/s':>8} {'peak MiB':>9}")
    for r in rows:
        print(f"{label(r):<34} {r['median_s']:>9.4f} {r['min_s']:>8.4f}-{r['max_s']:<8.4f} "
              f"{r['img_per_s']:>8.2f} {r['peak_mib']:>9.0f}")
    print("\ntime ratios: median of the per-round ratios [bootstrap 95% interval] (min-max), ratio of the best "
          "times; throughput ratio = 1 / time ratio")
    for c in ratios:
        peak = f", peak memory ratio {c['peak_ratio']:.3f}" if c["peak_ratio"] else ""
        print(f"{c['a']} / {c['b']}: {c['median']:.3f} [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}] "
              f"({c['min']:.3f}-{c['max']:.3f}), best {c['best_ratio']:.3f}{peak}")


if __name__ == "__main__":
    main()
