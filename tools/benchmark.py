#!/usr/bin/env python
"""Speed and memory of SR-ViT against timm's ViT of the same width and depth = D_eff (the
physical reference: same number of block applications) and timm's DeiT-S / DeiT-B; of
variants of one SR-ViT side by side; and of whole Mask R-CNN training steps.

    python tools/benchmark.py --model srvit_s_t3 --size 224 --batch-size 8
    python tools/benchmark.py --model srvit_s_t4 --size 1024 --batch-size 1 --modes train \\
        --grad-checkpointing both --references --json docs/bench_s_t4_1024.json
    python tools/benchmark.py --model srvit_s_t3 --size 1024 --batch-size 1 --references \\
        --variant global: --variant win:window_size=14,use_rel_pos=True
    python tools/benchmark.py --model srvit_s_t3 --size 1024 --batch-size 2 --amp --references \
        vit_same_depth vitdet_same_depth --variant global: --variant win:window_size=14,use_rel_pos=True
    python tools/benchmark.py --detector mask_rcnn_srvit_s_t3.py mask_rcnn_deit_s.py --batch-size 1
    python tools/benchmark.py --detector reference/mask_rcnn_vitdet_b.py mask_rcnn_srvit_s_t3_win.py \
        --batch-size 1 --amp
    python tools/benchmark.py --attention --size 1024 --batch-size 2
    python tools/benchmark.py --model srvit_s_t3 --modes infer --references --amp both
    python tools/benchmark.py --model srvit_s_t3 --references --compile both

References: ``vit_same_depth`` is timm's ViT of the model's width and depth = D_eff (the
physical reference of global attention); ``vitdet_same_depth`` is detectron2's own ViTDet ``ViT``
with the first windowed variant's width, heads, depth = D_eff, window size and global
applications, relative positions on (the physical reference of the windowed variants).
Attention mode (``--attention``): the relative-position attention kernels one by one
(``srvit_backbones.models.rel_pos.KERNELS`` and the default choice) beside flash attention
without a bias, detectron2's formula and SDPA with a materialised bias, for the global grid of
``--size`` and its 14x14 windows: forward and forward+backward times, what a training step
keeps for the backward, GPU peak memory, and each output's and gradient's error against
detectron2's formula.
Variants: ``--variant NAME:key=value,...`` builds ``--model`` with those core (``SRViT``)
arguments, values read as Python literals (``global_attn_indexes=(0, 31)``); several
``--variant`` run interleaved and each is compared with the first, with its parameter count.
Detector mode (``--detector CONFIG ...``): each detectron2 LazyConfig is built as
tools/train_net.py builds it (``load_config`` + ``instantiate``, the config's optimizer) and
steps on a synthetic batch at the config's input size (``model.backbone.square_pad``): images
with a few boxes and polygon masks, as the COCO mapper yields them. A training step is
forward, backward and optimizer step; ``--grad-checkpointing`` sets the backbone's
``use_act_checkpoint``. ``--amp`` is ``srvit_backbones.amp``'s autocast (fp16 on CUDA, bf16 on
a CPU with native bf16, a clear error on one without); ``--amp both`` interleaves it with
fp32. No loss scaling: the steps are timed, not trained to convergence. ``--compile`` times
``torch.compile(model)`` (inductor; compiled while warming up, so give it ``--warmup`` >= 1);
``--compile both`` pairs each model with its eager run.

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
parameters and optimizer state included; GPU: max allocated), so the figure is that model's alone.
The table shows medians and spreads (min-max); --json writes every repeat and the command.
"""
import argparse
import ast
import ctypes
import functools
import importlib.util
import inspect
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
import torch.nn.functional as F

import srvit_backbones  # noqa: F401  (registers the SR-ViT variants)
from srvit_backbones import SRViT, amp
from srvit_backbones.models import VARIANTS

REFERENCE_SAME_DEPTH = "vit_same_depth"
REFERENCE_VITDET = "vitdet_same_depth"
SAME_DEPTH = (REFERENCE_SAME_DEPTH, REFERENCE_VITDET)
SUBJECTS = ("srvit", "detectron2")  # what is measured; the other kinds are references
SET_BY_TOOL = ("img_size", "num_classes")  # core arguments the benchmark sets itself
SHORT_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}


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


# ---------------------------------------------------------------- variants of the core model
def parse_variant(spec):
    """``NAME:key=value,...`` -> (NAME, {key: value}); values are Python literals. Raises
    ValueError naming the problem and the expected form."""
    form = "expected NAME:key=value,... (e.g. win:window_size=14,use_rel_pos=True; 'global:' for no arguments)"
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not sep or not name or not all(c.isalnum() or c in "_.-" for c in name):
        raise ValueError(f"--variant {spec!r}: {form}")
    try:
        call = ast.parse(f"f({rest})", mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"--variant {spec!r}: {e.msg}; {form}") from None
    if call.args or any(kw.arg is None for kw in call.keywords):
        raise ValueError(f"--variant {spec!r}: every argument needs a name; {form}")
    kwargs = {}
    for kw in call.keywords:
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            raise ValueError(f"--variant {spec!r}: the value of {kw.arg} is not a Python literal "
                             f"({ast.unparse(kw.value)}); quote strings: {kw.arg}='...'") from None
    known = [p for p in inspect.signature(SRViT).parameters if p not in SET_BY_TOOL]
    for key in kwargs:
        if key in SET_BY_TOOL:
            raise ValueError(f"--variant {spec!r}: {key} is set by the benchmark (--size, and a 1000-class head "
                             f"only at 224); leave it out")
        if key not in known:
            raise ValueError(f"--variant {spec!r}: {key!r} is not an SRViT argument; known: {', '.join(known)}")
    return name, kwargs


# ---------------------------------------------------------------- models and their steps
class LastFeature(torch.nn.Module):
    """detectron2's ``ViT`` returns {"last_feat": map}; the steps take the map."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)["last_feat"]


def vitdet_same_depth(model, size, grad_ckpt):
    """detectron2's ViTDet ``ViT`` applying as many blocks as ``model`` (an SR-ViT) does, of its
    width and heads, windowed and global where its applications are, relative positions on."""
    from detectron2.modeling import ViT

    depth = model.effective_depth
    return LastFeature(ViT(
        img_size=size, patch_size=16, embed_dim=model.embed_dim, depth=depth,
        num_heads=model.units[0].blocks[0].attn.num_heads, mlp_ratio=4, qkv_bias=True,
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6), window_size=model.window_size,
        window_block_indexes=[i for i in range(depth) if i not in model.global_attn_indexes],
        use_rel_pos=True, use_act_checkpoint=grad_ckpt, out_feature="last_feat"))


def build(kind, name, size, grad_ckpt, model_args=None):
    num_classes = 1000 if size == 224 else 0
    if kind == REFERENCE_VITDET:
        return vitdet_same_depth(timm.create_model(name, img_size=size, num_classes=0, **model_args), size, grad_ckpt)
    if kind == REFERENCE_SAME_DEPTH:
        ref = timm.create_model(name, img_size=size, num_classes=0)
        model = timm.models.vision_transformer.VisionTransformer(
            img_size=size, patch_size=16, embed_dim=ref.embed_dim, depth=ref.effective_depth,
            num_heads=ref.units[0].blocks[0].attn.num_heads, num_classes=num_classes)
    else:
        model = timm.create_model(name, img_size=size, num_classes=num_classes, **(model_args or {}))
    model.set_grad_checkpointing(grad_ckpt)
    return model


def autocast(job, device):
    return amp.autocast(str(device), job["amp"], getattr(torch, job["amp_dtype"]) if job["amp"] else None)


def make_step(model, job, args, device):
    x = torch.randn(args.batch_size, 3, args.size, args.size, device=device)
    if job["mode"] == "infer":
        model.eval()

        def step():
            with torch.inference_mode(), autocast(job, device):
                model(x)
        return step
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with autocast(job, device):
            out = model(x)
        out.float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


# ---------------------------------------------------------------- detector mode (detectron2)
@functools.lru_cache(maxsize=None)
def _train_net():
    """tools/train_net.py, loaded by path (imported only in detector mode: it needs detectron2)."""
    spec = importlib.util.spec_from_file_location("srvit_train_net", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "train_net.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def detector_config(job):
    """The config as tools/train_net.py loads it, with the job's overrides."""
    opts = list(job["overrides"]) + (["model.backbone.net.use_act_checkpoint=True"] if job["grad_checkpointing"] else [])
    cfg = _train_net().load_config(argparse.Namespace(config_file=job["name"], opts=opts))
    size = cfg.model.backbone.get("square_pad") if "backbone" in cfg.model else None
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"--detector {job['name']}: the detector mode needs model.backbone.square_pad (the ViTDet "
                         f"input size; the images are made that size), got {size!r}: use a config with a "
                         f"SimpleFeaturePyramid backbone such as detectron2_configs/mask_rcnn_srvit_s_t3.py")
    return cfg, size


def synthetic_detection_batch(batch_size, size):
    """Images with four instances each (boxes, classes, polygon masks), as detectron2's COCO
    mapper yields them (uint8 CHW image, ``Instances`` with polygon ``gt_masks``)."""
    from detectron2.structures import Instances, PolygonMasks
    g = torch.Generator().manual_seed(0)
    shapes = [(0.10, 0.10, 0.40, 0.50), (0.50, 0.20, 0.90, 0.60), (0.20, 0.60, 0.50, 0.90), (0.60, 0.65, 0.85, 0.95)]
    batch = []
    for _ in range(batch_size):
        polygons = [[[x0 * size, y0 * size, x1 * size, y0 * size, (x0 + x1) / 2 * size, y1 * size]]
                    for x0, y0, x1, y1 in shapes]  # triangles
        masks = PolygonMasks(polygons)
        instances = Instances((size, size), gt_boxes=masks.get_bounding_boxes(),
                              gt_classes=torch.tensor([1, 2, 3, 4]), gt_masks=masks)
        batch.append({"image": torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g),
                      "instances": instances, "height": size, "width": size})
    return batch


def make_detector_step(job, args, device):
    """(step, model, input size) of a detectron2 config; the model moves the inputs to its device."""
    from detectron2.config import instantiate
    from detectron2.utils.events import EventStorage
    cfg, size = detector_config(job)
    model = instantiate(cfg.model).to(device)
    batch = synthetic_detection_batch(args.batch_size, size)
    if job["mode"] == "infer":
        model.eval()
        images = [{k: v for k, v in x.items() if k != "instances"} for x in batch]

        def step():
            with torch.inference_mode(), autocast(job, device):
                model(images)
        return step, model, size
    model.train()
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)

    def step():
        with EventStorage(), autocast(job, device):  # the detector logs training statistics
            losses = model(batch)
        sum(loss.float() for loss in losses.values()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step, model, size


def build_job(job, args, device):
    """(step, parameters in millions, input size) of one job."""
    if job["kind"] == "detectron2":
        step, model, size = make_detector_step(job, args, device)
    else:
        model = build(job["kind"], job["name"], args.size, job["grad_checkpointing"], job.get("model_args")).to(device)
        compiled = torch.compile(model) if job.get("compiled") else model
        step, size = make_step(compiled, job, args, device), args.size
    return step, sum(p.numel() for p in model.parameters()) / 1e6, size


def time_interleaved(jobs, args, device):
    """Build every job's model in this process and warm each up; then run ``args.repeats``
    rounds of one step per model, alternating the order every round (A B C, C B A, ...)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    steps, params_m, sizes = [], [], []
    for job in jobs:
        step, n, size = build_job(job, args, device)
        steps.append(step)
        params_m.append(n)
        sizes.append(size)
        for _ in range(args.warmup):
            step()
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
    for job, n, size, t, s, f in zip(jobs, params_m, sizes, times, started, faults):
        rows.append(dict(job, params_m=n, size=size, batch_size=args.batch_size, times_s=t, step_started=s,
                         median_s=statistics.median(t), min_s=min(t), max_s=max(t),
                         img_per_s=args.batch_size / statistics.median(t), minor_page_faults=f))
    return rows


def peak_memory_worker(args):
    """In a process of its own: build, run two steps (the second one with the optimizer state
    that the first created), print the peak memory."""
    device = torch.device(args.device)
    job = ast.literal_eval(args.job)
    rss_before = peak_rss_mib()
    step = build_job(job, args, device)[0]
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
    argv = [sys.executable, os.path.abspath(__file__), "--memory-worker", "--job", repr(job),
            "--size", str(args.size), "--batch-size", str(args.batch_size), "--device", args.device]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"peak-memory measurement failed ({label(job)}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- comparisons and report
def label(row):
    if row["kind"] == REFERENCE_SAME_DEPTH:
        name = f"timm ViT depth={_deff(row['name'])}"
    elif row["kind"] == REFERENCE_VITDET:
        name = f"detectron2 ViTDet depth={_deff(row['name'])}"
    elif row["kind"] == "detectron2":
        name = os.path.splitext(os.path.basename(row["name"]))[0]
    else:
        name = row["name"] + (f"[{row['variant']}]" if row.get("variant") else "")
    return (f"{name} {row['mode']}" + (" ckpt" if row["grad_checkpointing"] else "")
            + (f" {SHORT_DTYPE.get(row['amp_dtype'], row['amp_dtype'])}" if row["amp"] else "")
            + (" compiled" if row.get("compiled") else ""))


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
                peak_ratio=a["peak_mib"] / b["peak_mib"] if b["peak_mib"] else None,
                params_diff_m=a["params_m"] - b["params_m"])


def model_key(row):
    return row["kind"], row["name"], row.get("variant"), tuple(row.get("overrides", ()))


def comparisons(rows):
    """Within one mode: every measured model (SR-ViT variant or detector config) against every
    reference and against the first measured model, at equal checkpointing, precision and
    compilation; and each measured model with checkpointing against itself without, with
    autocast against itself in fp32, compiled against itself eager."""
    subjects = [r for r in rows if r["kind"] in SUBJECTS]
    first = model_key(subjects[0]) if subjects else None
    out = []
    for a in subjects:
        for b in rows:
            if b is a or b["mode"] != a["mode"]:
                continue
            same_ckpt, same_amp = a["grad_checkpointing"] == b["grad_checkpointing"], a["amp"] == b["amp"]
            same_compile = a.get("compiled") == b.get("compiled")
            if model_key(b) == model_key(a):
                if (same_amp and same_compile and a["grad_checkpointing"] and not b["grad_checkpointing"]) or \
                        (same_ckpt and same_compile and a["amp"] and not b["amp"]) or \
                        (same_ckpt and same_amp and a.get("compiled") and not b.get("compiled")):
                    out.append(paired_ratio(a, b))
            elif same_ckpt and same_amp and same_compile and (b["kind"] not in SUBJECTS or model_key(b) == first):
                out.append(paired_ratio(a, b))
    return out


def report(rows, ratios):
    width = max(len(label(r)) for r in rows) + 2
    print(f"{'model':<{width}} {'params M':>9} {'median s':>9} {'spread s':>17} {'img/s':>8} {'peak MiB':>9}")
    for r in rows:
        print(f"{label(r):<{width}} {r['params_m']:>9.3f} {r['median_s']:>9.4f} {r['min_s']:>8.4f}-{r['max_s']:<8.4f} "
              f"{r['img_per_s']:>8.2f} {r['peak_mib']:>9.0f}")
    print("\ntime ratios: median of the per-round ratios [bootstrap 95% interval] (min-max), ratio of the best "
          "times; throughput ratio = 1 / time ratio")
    for c in ratios:
        peak = f", peak memory ratio {c['peak_ratio']:.3f}" if c["peak_ratio"] else ""
        params = f", params {c['params_diff_m']:+.3f}M" if c["params_diff_m"] else ""
        print(f"{c['a']} / {c['b']}: {c['median']:.3f} [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}] "
              f"({c['min']:.3f}-{c['max']:.3f}), best {c['best_ratio']:.3f}{peak}{params}")


# ---------------------------------------------------------------- command line
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="srvit_s_t3", help="SR-ViT variant")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:key=value,...",
                   help="--model with these core arguments (Python literals); repeat to compare, the first is "
                        "the baseline; e.g. --variant global: --variant win:window_size=14,use_rel_pos=True")
    p.add_argument("--detector", nargs="+", metavar="CONFIG",
                   help="time whole detectron2 steps of these LazyConfigs (paths or shipped names) instead of "
                        "backbones, at each config's input size (--model, --variant, --references, --size unused)")
    p.add_argument("--detector-opts", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides applied to every --detector config, as tools/train_net.py takes them")
    p.add_argument("--size", type=int, default=224, help="224 (classification), 512 (seg), 1024 (det)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--modes", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    p.add_argument("--grad-checkpointing", choices=["off", "on", "both"], default="off",
                   help="activation checkpointing in the training step")
    p.add_argument("--references", nargs="*", default=[REFERENCE_SAME_DEPTH, "deit_small_patch16_224",
                                                        "deit_base_patch16_224"],
                   help=f"{REFERENCE_SAME_DEPTH}, {REFERENCE_VITDET} (the windowed variants' reference; needs "
                        f"detectron2) and/or timm model names; empty: SR-ViT alone")
    p.add_argument("--attention", action="store_true",
                   help="time the relative-position attention kernels at --size (global grid and 14x14 windows) "
                        "against flash attention, detectron2's formula and SDPA with a bias")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (one step per model each)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", nargs="?", const="on", default="off", choices=["off", "on", "both"],
                   help="autocast (fp16 on CUDA, bf16 on a CPU with native bf16); 'both': with and without")
    p.add_argument("--compile", nargs="?", const="on", default="off", choices=["off", "on", "both"],
                   help="torch.compile the models (inductor); 'both': compiled and eager, paired")
    p.add_argument("--json", help="write results here")
    p.add_argument("--default-malloc", action="store_true",
                   help="time with the C library's default allocator settings (see keep_freed_memory)")
    # internal: the peak-memory process of one job
    p.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def check_args(args):
    """Every problem with the arguments at once, each with what to do; returns the parsed
    variants [(name, core arguments)] and the autocast dtype (None without --amp)."""
    errors, variants, dtype = [], [], None
    if args.model not in VARIANTS:
        errors.append(f"unknown --model {args.model!r}; known: {', '.join(VARIANTS)}")
    if args.size < 16 or args.size % 16:
        errors.append(f"--size {args.size} is not a positive multiple of the patch size 16")
    if args.batch_size < 1 or args.warmup < 0 or args.repeats < 1:
        errors.append("--batch-size and --repeats must be >= 1, --warmup >= 0")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        errors.append(f"--device {args.device}: CUDA is not available here; use --device cpu")
    elif args.amp != "off":
        try:
            dtype = str(amp.amp_dtype(args.device)).replace("torch.", "")
        except ValueError as e:
            errors.append(str(e))
    if args.attention and (args.detector or args.variant or args.amp != "off" or args.compile != "off"):
        errors.append("--attention times the attention kernels alone, in both of the device's precisions "
                      f"({', '.join(ATTENTION_DTYPES['cuda' if args.device.startswith('cuda') else 'cpu'])}): "
                      "drop --detector, --variant, --amp and --compile")
    if args.detector:
        if args.compile != "off":
            errors.append("--compile times compiled backbones (--model, --variant); a --detector step is eager")
        if args.variant:
            errors.append("--variant changes the --model backbone; with --detector pass config overrides "
                          "with --detector-opts (e.g. model.backbone.net.window_size=14)")
    else:
        for ref in args.references:
            if ref not in SAME_DEPTH and not timm.is_model(ref):
                errors.append(f"--references {ref!r} is neither one of {SAME_DEPTH} nor a timm model name")
        for spec in args.variant:
            try:
                variants.append(parse_variant(spec))
            except ValueError as e:
                errors.append(str(e))
        if REFERENCE_VITDET in args.references and not windowed_variant(variants):
            errors.append(f"--references {REFERENCE_VITDET} mirrors a windowed model: add a --variant with windows, "
                          f"e.g. --variant win:window_size=14,use_rel_pos=True")
        names = [name for name, _ in variants]
        if len(set(names)) != len(names):
            errors.append(f"--variant names must differ, got {names}")
    if not errors and variants:  # the core's own checks (a window size < 0, ...), before any timing
        for name, kwargs in variants:
            try:
                build("srvit", args.model, args.size, False, kwargs)
            except (TypeError, ValueError) as e:
                errors.append(f"--variant {name}: {args.model} refuses {kwargs}: {e}")
    if errors:
        sys.exit("benchmark: " + "; ".join(errors))
    return variants, dtype


def windowed_variant(variants):
    """The core arguments of the first variant with windows (None if there is none)."""
    return next((kwargs for _, kwargs in variants if kwargs.get("window_size")), None)


def make_jobs(args, variants, dtype, mode):
    ckpt = {"off": [False], "on": [True], "both": [False, True]}[args.grad_checkpointing]
    amps = {"off": [False], "on": [True], "both": [False, True]}[args.amp]
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    if args.detector:
        models = [dict(kind="detectron2", name=c, overrides=list(args.detector_opts)) for c in args.detector]
    else:
        models = ([dict(kind="srvit", name=args.model, variant=name, model_args=kwargs) for name, kwargs in variants]
                  or [dict(kind="srvit", name=args.model)])
        models += [dict(kind=REFERENCE_SAME_DEPTH, name=args.model) if r == REFERENCE_SAME_DEPTH
                   else dict(kind=REFERENCE_VITDET, name=args.model, model_args=windowed_variant(variants))
                   if r == REFERENCE_VITDET else dict(kind="timm", name=r) for r in args.references]
    return [dict(m, mode=mode, grad_checkpointing=c, amp=a, amp_dtype=dtype if a else None, compiled=compiled)
            for m in models for c in (ckpt if mode == "train" else [False]) for a in amps for compiled in compiles]


def main(argv=None):
    args = parse_args(argv)
    if args.memory_worker:
        return peak_memory_worker(args)
    variants, dtype = check_args(args)
    if args.attention:
        return attention_benchmark(args)
    if args.detector:
        for config in args.detector:  # a wrong name or a config without an input size, before any timing
            try:
                detector_config(dict(name=config, overrides=args.detector_opts, grad_checkpointing=False))
            except ValueError as e:
                sys.exit(f"benchmark: {e}")
    torch.manual_seed(0)
    malloc = None if args.default_malloc else keep_freed_memory()
    rows = []
    for mode in args.modes:
        jobs = make_jobs(args, variants, dtype, mode)
        peaks = [measure_peak_memory(job, args) for job in jobs]
        for row, peak in zip(time_interleaved(jobs, args, torch.device(args.device)), peaks):
            rows.append(dict(row, **peak))
    ratios = comparisons(rows)
    report(rows, ratios)
    versions = dict(torch=torch.__version__, timm=timm.__version__)
    if args.detector:
        import detectron2
        versions["detectron2"] = detectron2.__version__
    result = dict(command=" ".join([os.path.relpath(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
                  machine=dict(platform=platform.platform(), processor=cpu_name(), cpus=os.cpu_count(),
                               torch_threads=torch.get_num_threads(), **versions, device=args.device,
                               gpu=torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None),
                  method=dict(time="interleaved rounds in one process", malloc=malloc or "default",
                              peak_memory="one process per model, default allocator", amp_dtype=dtype),
                  rows=rows, comparisons=ratios)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


# ---------------------------------------------------------------- attention mode
#: the precisions the attention mode times on each device type
ATTENTION_DTYPES = {"cuda": ("float16", "bfloat16"), "cpu": ("float32", "bfloat16")}
ATTENTION_HEADS, ATTENTION_HEAD_DIM, VITDET_WINDOW = 6, 64, 14  # SR-ViT-S, ViTDet's windows


def detectron2_formula(q, k, v, rel_pos_h, rel_pos_w, size):
    """ViTDet's attention from its q, k, v: the scores materialised, detectron2's
    ``add_decomposed_rel_pos``, softmax, values: the reference every kernel is checked against."""
    from detectron2.modeling.backbone.utils import add_decomposed_rel_pos

    B, heads, N, C = q.shape
    qf, kf = q.reshape(B * heads, N, C), k.reshape(B * heads, N, C)
    attn = add_decomposed_rel_pos((qf * C ** -0.5) @ kf.transpose(-2, -1), qf, rel_pos_h, rel_pos_w, size, size)
    return (attn.softmax(dim=-1) @ v.reshape(B * heads, N, C)).view(B, heads, N, C)


def attention_kernels():
    """name -> f(q, k, v, rel_pos_h, rel_pos_w, grid): ours (the default choice and each of
    ``KERNELS``; ``bias`` is SDPA with the materialised bias) and the references."""
    from srvit_backbones.models.rel_pos import KERNELS, rel_pos_attention

    kernels = {"flash, no bias": lambda q, k, v, h, w, size: F.scaled_dot_product_attention(q, k, v),
               "detectron2 formula": detectron2_formula,
               "ours (default choice)": rel_pos_attention}
    kernels.update({f"ours: {name}": functools.partial(rel_pos_attention, kernel=name) for name in KERNELS})
    return kernels


def attention_cases(args):
    """(case, attention maps' images, grid): the global grid of --size, and its windows of 14x14
    (the grid padded to whole windows, as ViTDet does) for --batch-size images."""
    side = args.size // 16
    windows = (-(-side // VITDET_WINDOW)) ** 2
    return [("global", args.batch_size, (side, side)), ("windows", args.batch_size * windows, (VITDET_WINDOW,) * 2)]


def attention_inputs(images, grid, device, dtype):
    """q, k, v in ``dtype`` (as autocast's projections give them) and float32 tables (parameters)."""
    g = torch.Generator().manual_seed(0)
    n = grid[0] * grid[1]
    qkv = [torch.randn(images, ATTENTION_HEADS, n, ATTENTION_HEAD_DIM, generator=g).to(device, dtype) for _ in range(3)]
    tables = [torch.randn(2 * side - 1, ATTENTION_HEAD_DIM, generator=g).mul_(0.1).to(device) for side in grid]
    return [t.requires_grad_() for t in qkv + tables]


def call_attention(fn, tensors, grid, device):
    """One call, under autocast for fp16 / bf16 inputs (as the model runs them)."""
    with torch.autocast(device.type, dtype=tensors[0].dtype, enabled=tensors[0].dtype != torch.float32):
        return fn(*tensors, grid)


def attention_gradients(out, tensors, device):
    """The inputs' gradients from fixed output gradients (None where one does not reach)."""
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    return torch.autograd.grad((out.float() * weights).sum(), tensors, allow_unused=True)


def saved_for_backward_mib(fn, tensors, grid, device):
    """What autograd keeps of one call for its backward (distinct storages), in MiB."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        call_attention(fn, tensors, grid, device)
    return sum(storages.values()) / 2 ** 20


def cosine(a, b):
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def attention_benchmark(args):
    """Every kernel of ``attention_kernels`` on every case of ``attention_cases`` in each of
    ATTENTION_DTYPES: forward and forward+backward times in interleaved rounds, what training
    keeps, GPU peak memory, and errors against detectron2's formula in float32."""
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    kernels = attention_kernels()
    rows = []
    for case, images, grid in attention_cases(args):
        fp32 = attention_inputs(images, grid, device, torch.float32)
        reference = call_attention(detectron2_formula, fp32, grid, device)
        reference_grads = attention_gradients(reference, fp32, device)
        reference = reference.detach()
        for dtype_name in ATTENTION_DTYPES[device.type]:
            tensors = attention_inputs(images, grid, device, getattr(torch, dtype_name))
            group = []
            for name, fn in kernels.items():
                # flex has no backward on the CPU; the others are timed forward and forward+backward
                trains = not (name == "ours: flex" and device.type == "cpu")
                row = dict(case=case, images=images, grid=list(grid), heads=ATTENTION_HEADS, dtype=dtype_name,
                           kernel=name, forward_s=[], forward_backward_s=[] if trains else None)
                with torch.no_grad():
                    out = call_attention(fn, [t.detach() for t in tensors], grid, device)
                row["output_cosine"] = cosine(out, reference)
                if trains:
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                        before = torch.cuda.memory_allocated()
                    grads = attention_gradients(call_attention(fn, tensors, grid, device), tensors, device)
                    if device.type == "cuda":
                        row["peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2 ** 20
                    row["gradient_cosines"] = [None if g is None else cosine(g, e) for g, e in zip(grads, reference_grads)]
                    row["saved_mib"] = saved_for_backward_mib(fn, tensors, grid, device)
                group.append((row, fn, trains))
            for r in range(args.warmup + args.repeats):
                for row, fn, trains in (group if r % 2 == 0 else reversed(group)):
                    sync()
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        call_attention(fn, [t.detach() for t in tensors], grid, device)
                    sync()
                    t1 = time.perf_counter()
                    if trains:
                        attention_gradients(call_attention(fn, tensors, grid, device), tensors, device)
                        sync()
                    if r >= args.warmup:
                        row["forward_s"].append(t1 - t0)
                        if trains:
                            row["forward_backward_s"].append(time.perf_counter() - t1 + row["forward_s"][-1])
            rows += [row for row, _, _ in group]
    report_attention(rows)
    result = dict(command=" ".join([os.path.relpath(sys.argv[0])] + (sys.argv[1:])), rows=rows,
                  machine=dict(platform=platform.platform(), processor=cpu_name(), torch=torch.__version__,
                               device=args.device,
                               gpu=torch.cuda.get_device_name(0) if device.type == "cuda" else None))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def report_attention(rows):
    print(f"{'case':<8} {'dtype':<9} {'kernel':<22} {'fwd ms':>8} {'fwd+bwd ms':>11} {'saved MiB':>10} "
          f"{'peak MiB':>9} {'out cos':>9} {'min grad cos':>12}")
    for r in rows:
        fb = f"{statistics.median(r['forward_backward_s']) * 1e3:>11.2f}" if r["forward_backward_s"] else f"{'-':>11}"
        grads = [c for c in r.get("gradient_cosines") or [] if c is not None]
        print(f"{r['case']:<8} {r['dtype']:<9} {r['kernel']:<22} {statistics.median(r['forward_s']) * 1e3:>8.2f} {fb} "
              f"{r.get('saved_mib', float('nan')):>10.1f} {r.get('peak_mib', float('nan')):>9.1f} "
              f"{r['output_cosine']:>9.5f} {min(grads) if grads else float('nan'):>12.5f}")
    print("\ncosines against detectron2's formula in float32 (flash has no relative positions: its gap is the bias's "
          "weight); saved: what a training step keeps for the backward; peak: GPU only")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


if __name__ == "__main__":
    main()
