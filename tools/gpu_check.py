#!/usr/bin/env python
"""The GPU check (``make gpu-check``): what a GPU user's run does, in one command and one JSON,
each figure beside its anchor measured in the same run.

    python tools/gpu_check.py                                   # one GPU
    python tools/gpu_check.py --device cpu --size 64 --steps 1 --checks a b c d e f g --compile-backend aot_eager

A preset of benchmark runs (``srvit_backbones.benchmark``, tools/benchmark.py's harness) plus
the checks of the training paths:
(a) a Mask R-CNN training step of ``mask_rcnn_srvit_s_t3_win.py`` and ``mask_rcnn_srvit_s_t3.py``
    at --size through detectron2's AMPTrainer (fp16 autocast + GradScaler), built as
    tools/train_net.py builds them: s/iter and peak memory, each paired with detectron2's own
    ViTDet ViT-B (``reference/mask_rcnn_vitdet_b.py``) stepped in the same run (the published
    0.314 s/iter, 10.9 GB on an A100 only where detectron2's model zoo is absent, and the JSON says so);
(b) an mmseg training step of ``upernet_srvit_s.py`` through its ``AmpOptimWrapper`` (skipped,
    with the reason, where mmseg or mmcv does not import: the check still passes);
(c) a pretraining step of tools/pretrain.py with ``--amp`` (fp16 + GradScaler on CUDA);
(d) the benchmark's inference img/s of SR-ViT-S T=3, DeiT-S and timm's ViT of depth D_eff
    at --throughput-size (224: the paper's) (paired ratios), next to the paper's 943 and 2614
    img/s (its GPU), with each model's MFU: achieved FLOP/s (2 x count_flops' multiply-adds at
    that size x img/s) over the GPU's dense fp16 / bf16 peak (PEAK_TFLOPS; "unknown" for a GPU
    not in it);
(e) the device branches against the CPU: the relative-position attention's kernel and block
    choices of the GPU against the CPU's (fp32, 1e-5), and on a GPU each kernel (``blocked``,
    ``bias``, also in calls of one map, ``flex``) forced there in fp16 and bf16, and a tiny
    windowed model's features and gradients there (fp32, fp16 and bf16 autocast), each against
    the CPU's fp32;
(f) the benchmark's --backbone (S-T3) at --size, global and windowed, inference and training
    step, paired with timm's ViT of depth D_eff (vit_same_depth) and detectron2's ViTDet of the
    same applications (vitdet_same_depth);
(g) the benchmark's ``--compile both``: --backbone compiled against eager at --throughput-size
    (batch --throughput-batch) and windowed at --size, inference and training step: the paired
    compiled / eager time, the first (compiling) step and the compile time apart from the step
    time, and the graph breaks (0 expected: the check fails otherwise); the training step at
    --throughput-size (224) is read against the target of >= 1.2x eager on a GPU.

Data are synthetic (images with boxes and masks, label maps, an ImageFolder of noise): the
check measures the code paths, speed and memory, not accuracy. On the CPU the frameworks'
AMP paths (AMPTrainer, AmpOptimWrapper) need CUDA, so (a) and (b) run in fp32 there and (c),
(d) and (g) in bf16 where the CPU has it (``srvit_backbones.amp``; ``--no-amp``: fp32). Without
CUDA and without ``--device`` it says so, runs (e) with the GPU's choices forced on the CPU and
exits 0.
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback

import torch

from srvit_backbones.benchmark import Timer, machine_record, model_flops_utilisation
from srvit_backbones.benchmark.backbones import build
from srvit_backbones.benchmark.data import synthetic_image_folder
from srvit_backbones.benchmark.devices import (kernel_choice_rows, kernels_on_device_against_cpu,
                                               model_on_device_against_cpu)
from srvit_backbones.benchmark.runner import COMPILE_BACKENDS, label
from srvit_backbones.benchmark.runner import main as benchmark_main

DETECTORS = ("mask_rcnn_srvit_s_t3_win.py", "mask_rcnn_srvit_s_t3.py")
VITDET_B = "reference/mask_rcnn_vitdet_b.py"  # detectron2's model-zoo ViTDet ViT-B Mask R-CNN
SEGMENTOR = "upernet_srvit_s.py"
WINDOWED = "win:window_size=14,use_rel_pos=True"  # ViTDet's windows, the _win configs' backbone
COMPILE_TARGET = 1.2  # compiled / eager speed of the training step at 224 on a GPU (issue 29)
#: the figures each check is read against
PUBLISHED = dict(
    vitdet_vit_b=dict(s_per_iter=0.314, train_memory_gb=10.9, gpu="A100", images_per_gpu=1,
                      source="detectron2 projects/ViTDet model zoo, Mask R-CNN ViT-B (64 GPUs, batch 64)"),
    srvit_s_t3_224_img_per_s=dict(value=943, source="SR-ViT paper Table 3, its GPU"),
    deit_s_224_img_per_s=dict(value=2614, source="SR-ViT paper Table 3, its GPU"),
)


def benchmark(argv, args):
    """One tools/benchmark.py run in this process (its table on stderr): its result."""
    argv = argv + ([] if args.peak_memory else ["--peak-memory", "off"])
    with contextlib.redirect_stdout(sys.stderr):
        return benchmark_main(argv)


def paired(result):
    """A benchmark result's paired comparisons, as the checks report them."""
    return [dict(a=c["a"], b=c["b"], time_ratio=c["median"], ci95=c["ci95"], peak_ratio=c["peak_ratio"])
            for c in result["comparisons"]]


# ---------------------------------------------------------------- (a) detectron2 Mask R-CNN, AMPTrainer
def check_detectron2(args, device):
    from srvit_backbones.detectron2.benchmark import detector_config, trainer_steps

    try:
        detector_config(VITDET_B)
        configs, reference = (VITDET_B,) + DETECTORS, None
    except Exception as e:  # detectron2 without its model zoo configs
        configs, reference = DETECTORS, dict(PUBLISHED["vitdet_vit_b"], why=f"{VITDET_B} not built: {e}")
    rows = []
    for config in configs:
        opts = [f"model.backbone.net.img_size={args.size}", f"model.backbone.square_pad={args.size}",
                f"train.device={device}", f"train.amp.enabled={device.type == 'cuda'}"]
        rows.append(trainer_steps(config, opts, images=args.images_per_gpu, warmup=args.warmup, steps=args.steps))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if reference is None:  # measured in this run: ours / ViTDet-B
        anchor = rows[0]
        for row in rows[1:]:
            row["vs_vitdet_b"] = dict(s_per_iter_ratio=row["s_per_iter"] / anchor["s_per_iter"],
                                      peak_memory_ratio=row["peak_memory_gb"] / anchor["peak_memory_gb"]
                                      if "peak_memory_gb" in row else None)
        reference = dict(measured=VITDET_B, s_per_iter=anchor["s_per_iter"],
                         peak_memory_gb=anchor.get("peak_memory_gb"))
    return dict(rows=rows, reference=reference)


# ---------------------------------------------------------------- (b) mmseg, AmpOptimWrapper
def check_mmseg(args, device):
    try:
        from srvit_backbones.mmseg.benchmark import segmentor_step
    except ImportError as e:  # a GPU machine without mmcv's compiled ops or mmseg: the other checks stand
        return dict(skipped=f"mmseg does not import ({type(e).__name__}: {e}); install mmcv with its ops and "
                            f"mmseg (docs/install.md) to run (b)")

    size = min(args.size, 512)  # the config's crop
    images = args.images_per_gpu * 2  # the config's 2 images per GPU (16 over 8)
    step, wrapper = segmentor_step(SEGMENTOR, size, images, device)
    timer = Timer(device)
    for _ in range(args.warmup + args.steps):
        with timer.step():
            log = step()
    scale = wrapper.loss_scaler.get_scale() if hasattr(wrapper, "loss_scaler") else None
    return dict(config=SEGMENTOR, size=size, images=images, optim_wrapper=type(wrapper).__name__,
                loss_scale=scale, loss=float(log["loss"].detach()), **timer.summary(args.warmup))


# ---------------------------------------------------------------- (c) pretraining with --amp
def check_pretrain(args, device):
    from srvit_backbones.pretrain import engine, recipe, trainer

    with tempfile.TemporaryDirectory() as root:
        synthetic_image_folder(root, classes=2, images=args.images_per_gpu * 2, size=64)
        size = min(args.size, 224)
        steps = args.warmup + args.steps
        run_args = recipe.parse(["--data", root, "--model", "srvit_s_t3", "--input-size", str(size),
                                 "--batch-size", str(args.images_per_gpu * 2), "--workers", "0", "--epochs", "1",
                                 "--max-iters-per-epoch", str(steps), "--log-interval", str(steps),
                                 "--output", os.path.join(root, "out"), "--device", str(device),
                                 "--amp", "auto" if args.pretrain_amp else "none"])
        run = trainer.build(run_args, distributed=False)
        dtypes = []
        run.model.units[1].blocks[0].attn.qkv.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
        timer = Timer(device)
        batches = list(run.train_loader)  # the loader's own batches, augmented and on the device
        for i in range(steps):
            with timer.step():
                engine.train_one_epoch(0, run.train_model, [batches[i % len(batches)]], run.optimizer, run.criterion,
                                       run.scheduler, run_args, loss_scaler=run.loss_scaler, mixup_fn=run.mixup_fn,
                                       state=run.state)
    return dict(model="srvit_s_t3", size=size, batch=run_args.batch_size, amp=run_args.amp,
                autocast_dtype=str(dtypes[-1]).replace("torch.", ""), grad_scaler=run.loss_scaler is not None,
                **timer.summary(args.warmup))


# ---------------------------------------------------------------- (d) inference throughput
def check_throughput(args, device):
    from srvit_backbones.flops import count_flops

    size = args.throughput_size
    argv = ["--model", "srvit_s_t3", "--size", str(size), "--batch-size", str(args.throughput_batch), "--modes", "infer",
            "--references", "deit_small_patch16_224", "vit_same_depth", "--warmup", str(args.warmup),
            "--repeats", str(args.steps), "--device", str(device), "--amp", "on" if args.pretrain_amp else "off"]
    result = benchmark(argv, args)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    rows = []
    for row in result["rows"]:
        model = build(row["kind"], row["name"], size, False).eval()
        gmacs = count_flops(model, (torch.randn(1, 3, size, size),)) / 1e9
        rows.append(dict(model=label(row).split(" infer")[0], img_per_s=row["img_per_s"],
                         median_s=row["median_s"], amp_dtype=row["amp_dtype"], batch_size=row["batch_size"],
                         **model_flops_utilisation(row["img_per_s"], gmacs, gpu)))
    return dict(command="python " + result["command"], rows=rows, paired=paired(result),
                reference=dict(srvit_s_t3=PUBLISHED["srvit_s_t3_224_img_per_s"],
                               deit_s=PUBLISHED["deit_s_224_img_per_s"]))


# ---------------------------------------------------------------- (e) device branches against the CPU
def check_branches(args, device):
    """The GPU's kernel and block choices against the CPU's on CPU tensors (always), and on a
    GPU each kernel forced there in fp16 and bf16 and the tiny windowed model, against the CPU's fp32."""
    rows = kernel_choice_rows()
    if device.type == "cuda":
        rows += kernels_on_device_against_cpu(device) + model_on_device_against_cpu(device)
    return dict(rows=rows, ok=all(row["ok"] for row in rows))


# ---------------------------------------------------------------- (f) the backbone beside its anchors
def check_backbone(args, device):
    """The backbone (S-T3) at --size, global and windowed (ViTDet's 14x14 windows, rel-pos), inference and
    training step, paired with vit_same_depth and vitdet_same_depth in interleaved rounds."""
    argv = ["--model", args.backbone, "--size", str(args.size), "--batch-size", str(args.images_per_gpu * 2),
            "--modes", "infer", "train", "--references", "vit_same_depth", "vitdet_same_depth",
            "--variant", "global:", "--variant", WINDOWED, "--warmup", str(args.warmup),
            "--repeats", str(args.steps), "--device", str(device), "--amp", "on" if device.type == "cuda" else "off"]
    result = benchmark(argv, args)
    rows = [dict(model=label(r), median_s=r["median_s"], peak_mib=r["peak_mib"]) for r in result["rows"]]
    return dict(command="python " + result["command"], rows=rows, paired=paired(result))


# ---------------------------------------------------------------- (g) torch.compile against eager
def check_compile(args, device):
    """--backbone compiled against eager (``--compile both``): at --throughput-size and windowed at
    --size, inference and training step; ok when no compiled model had a graph break."""
    common = ["--model", args.backbone, "--modes", "infer", "train", "--references", "--compile", "both",
              "--compile-backend", args.compile_backend, "--warmup", str(args.warmup), "--repeats", str(args.steps),
              "--device", str(device), "--amp", "on" if args.pretrain_amp else "off"]
    runs = [[*common, "--size", str(args.throughput_size), "--batch-size", str(args.throughput_batch)],
            [*common, "--size", str(args.size), "--batch-size", str(args.images_per_gpu * 2), "--variant", WINDOWED]]
    commands, rows = [], []
    for argv in runs:
        result = benchmark(argv, args)
        commands.append("python " + result["command"])
        by_label = {label(r): r for r in result["rows"]}
        for c in result["comparisons"]:  # one model: compiled / eager of each mode
            compiled, eager = by_label[c["a"]], by_label[c["b"]]
            rows.append(dict(model=c["b"], compiled_model=c["a"], size=compiled["size"], batch_size=compiled["batch_size"],
                             backend=compiled["compile_backend"], eager_s=eager["median_s"],
                             compiled_s=compiled["median_s"], time_ratio=c["median"], ci95=c["ci95"],
                             speedup=1 / c["median"], peak_ratio=c["peak_ratio"],
                             **{k: compiled[k] for k in ("first_step_s", "compile_s", "graph_breaks",
                                                         "graph_break_reasons", "graphs", "fx_graph_cache")}))
    train = next(r for r in rows if " train" in r["model"])  # the first run's: at --throughput-size
    target = dict(claim=f"compiled >= {COMPILE_TARGET}x eager, training step at {args.throughput_size}, on a GPU",
                  speedup=train["speedup"], met=train["speedup"] >= COMPILE_TARGET if device.type == "cuda" else None)
    return dict(commands=commands, rows=rows, target=target, ok=all(r["graph_breaks"] == 0 for r in rows))


CHECKS = dict(a=check_detectron2, b=check_mmseg, c=check_pretrain, d=check_throughput, e=check_branches,
              f=check_backbone, g=check_compile)


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
    checks = args.checks or sorted(CHECKS)
    result = dict(command=" ".join(["tools/gpu_check.py"] + (argv if argv is not None else sys.argv[1:])),
                  machine=machine_record(device), published=PUBLISHED, checks={})
    for name in checks:
        print(f"gpu_check: ({name}) {CHECKS[name].__name__} ...", flush=True)
        started = time.time()
        try:
            entry = dict(dict(ok=True), **CHECKS[name](args, device))
        except (Exception, SystemExit) as e:  # one failing check does not hide the others' figures
            entry = dict(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        entry["wall_s"] = round(time.time() - started, 1)
        result["checks"][name] = entry
        verdict = ("skipped: " + entry["skipped"]) if "skipped" in entry else \
            "ok" if entry["ok"] else "FAILED: " + entry.get("error", "see its rows")
        print(f"gpu_check: ({name}) {verdict} in {entry['wall_s']} s", flush=True)
    result["ok"] = all(entry["ok"] for entry in result["checks"].values())
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(json.dumps({name: {k: v for k, v in entry.items() if k not in ("traceback", "times_s")}
                      for name, entry in result["checks"].items()}, indent=1, default=str))
    print(f"gpu_check: wrote {args.output}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
