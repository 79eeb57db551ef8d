"""tools/gpu_check.py (``make gpu-check``): what a GPU user's run does, in one command and one JSON, each figure
beside its anchor measured in the same run (docs/performance.md: what each check runs and is read against).

(a) detectron2's Mask R-CNN step (AMPTrainer) beside ViTDet-B; (b) mmseg's UPerNet step (AmpOptimWrapper); (c) a
tools/pretrain.py step with --amp; (d) inference img/s and MFU; (e) the device branches against the CPU; (f) the
backbone beside its anchors; (g) compiled against eager. (a), (b) go through the framework table (no import here).
"""
import contextlib
import os
import sys
import tempfile
import time
import traceback
from typing import Callable

import torch

from ...frameworks import adapter, load_config
from . import Timer, machine_record, model_flops_utilisation
from .backbones import build
from .data import synthetic_image_folder
from .devices import kernel_choice_rows, kernels_on_device_against_cpu, model_on_device_against_cpu
from .runner import label
from .runner import main as benchmark_main

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


def benchmark(argv, args, device, amp):
    """One tools/benchmark.py run in this process with the check's steps, ``device`` and ``amp`` (its
    table on stderr): its result."""
    argv = [*argv, "--warmup", str(args.warmup), "--repeats", str(args.steps), "--device", str(device),
            "--amp", "on" if amp else "off", *([] if args.peak_memory else ["--peak-memory", "off"])]
    with contextlib.redirect_stdout(sys.stderr):
        return benchmark_main(argv)


def paired(result):
    """A benchmark result's paired comparisons, as the checks report them."""
    return [dict(a=c["a"], b=c["b"], time_ratio=c["median"], ci95=c["ci95"], peak_ratio=c["peak_ratio"])
            for c in result["comparisons"]]


def time_training(framework, config, size, images, args, device):
    """The framework adapter's ``time_training`` row of one config, the GPU's cache emptied after it."""
    row = framework.time_training(config, size, images, device, args.warmup, args.steps)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def check_detectron2(args, device):
    """(a) Mask R-CNN training steps through detectron2's trainer, after ViTDet-B's in the same run
    (each row's ``vs_vitdet_b``), or beside the published figures where ViTDet-B does not load."""
    framework, configs, reference = adapter("detectron2"), DETECTORS, None
    try:
        load_config(VITDET_B, "detectron2")
        configs = (VITDET_B,) + configs
    except Exception as e:  # detectron2 without its model zoo's configs
        reference = dict(PUBLISHED["vitdet_vit_b"], why=f"{VITDET_B} not built: {e}")
    rows = [time_training(framework, config, args.size, args.images_per_gpu, args, device) for config in configs]
    if reference is None:  # measured in this run: ours / the anchor
        anchor = rows[0]
        for row in rows[1:]:
            row["vs_vitdet_b"] = dict(
                s_per_iter_ratio=row["s_per_iter"] / anchor["s_per_iter"],
                peak_memory_ratio=row["peak_memory_gb"] / anchor["peak_memory_gb"] if "peak_memory_gb" in row
                else None)
        reference = dict(measured=VITDET_B, s_per_iter=anchor["s_per_iter"],
                         peak_memory_gb=anchor.get("peak_memory_gb"))
    return dict(rows=rows, reference=reference)


def check_mmseg(args, device):
    """(b) UPerNet's training step through mmengine's AmpOptimWrapper at the config's crop (at most 512)
    and 2 x --images-per-gpu images; skipped, with the reason, where mmseg does not import."""
    try:
        framework = adapter("mmseg")
    except ImportError as e:  # a GPU machine without mmseg: the other checks stand
        cause = e.__cause__ or e  # the framework's own ImportError
        return dict(skipped=f"mmseg does not import ({type(cause).__name__}: {cause}); "
                            f"install mmcv with its ops and mmseg (docs/install.md) to run (b)")
    return time_training(framework, SEGMENTOR, min(args.size, 512), args.images_per_gpu * 2, args, device)


def check_pretrain(args, device):
    """(c) tools/pretrain.py's training steps with ``--amp`` (fp16 + GradScaler on CUDA) on a synthetic ImageFolder."""
    from ...pretrain import engine, recipe, trainer

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


def check_throughput(args, device):
    """(d) Inference img/s of S-T3, DeiT-S and vit_same_depth at --throughput-size, paired, each with its MFU."""
    from ..flops import count_flops

    size = args.throughput_size
    argv = ["--model", "srvit_s_t3", "--size", str(size), "--batch-size", str(args.throughput_batch),
            "--modes", "infer", "--references", "deit_small_patch16_224", "vit_same_depth"]
    result = benchmark(argv, args, device, args.pretrain_amp)
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


def check_branches(args, device):
    """(e) The GPU's kernel choices against the CPU's; on a GPU also each kernel and a tiny model there."""
    rows = kernel_choice_rows()
    if device.type == "cuda":
        rows += kernels_on_device_against_cpu(device) + model_on_device_against_cpu(device)
    return dict(rows=rows, ok=all(row["ok"] for row in rows))


def check_backbone(args, device):
    """(f) --backbone at --size, global and windowed, paired with vit_same_depth and vitdet_same_depth."""
    argv = ["--model", args.backbone, "--size", str(args.size), "--batch-size", str(args.images_per_gpu * 2),
            "--modes", "infer", "train", "--references", "vit_same_depth", "vitdet_same_depth",
            "--variant", "global:", "--variant", WINDOWED]
    result = benchmark(argv, args, device, device.type == "cuda")
    rows = [dict(model=label(r), median_s=r["median_s"], peak_mib=r["peak_mib"]) for r in result["rows"]]
    return dict(command="python " + result["command"], rows=rows, paired=paired(result))


def check_compile(args, device):
    """(g) --backbone compiled against eager, at --throughput-size and windowed at --size; ok without graph breaks."""
    common = ["--model", args.backbone, "--modes", "infer", "train", "--references", "--compile", "both",
              "--compile-backend", args.compile_backend]
    runs = [[*common, "--size", str(args.throughput_size), "--batch-size", str(args.throughput_batch)],
            [*common, "--size", str(args.size), "--batch-size", str(args.images_per_gpu * 2), "--variant", WINDOWED]]
    commands, rows = [], []
    for argv in runs:
        result = benchmark(argv, args, device, args.pretrain_amp)
        commands.append("python " + result["command"])
        by_label = {label(r): r for r in result["rows"]}
        for c in result["comparisons"]:  # one model: compiled / eager of each mode
            compiled, eager = by_label[c["a"]], by_label[c["b"]]
            rows.append(dict(model=c["b"], compiled_model=c["a"], size=compiled["size"],
                             batch_size=compiled["batch_size"], backend=compiled["compile_backend"],
                             eager_s=eager["median_s"], compiled_s=compiled["median_s"], time_ratio=c["median"],
                             ci95=c["ci95"], speedup=1 / c["median"], peak_ratio=c["peak_ratio"],
                             **{k: compiled[k] for k in ("first_step_s", "compile_s", "graph_breaks",
                                                         "graph_break_reasons", "graphs", "fx_graph_cache")}))
    train = next(r for r in rows if " train" in r["model"])  # the first run's: at --throughput-size
    target = dict(claim=f"compiled >= {COMPILE_TARGET}x eager, training step at {args.throughput_size}, on a GPU",
                  speedup=train["speedup"], met=train["speedup"] >= COMPILE_TARGET if device.type == "cuda" else None)
    return dict(commands=commands, rows=rows, target=target, ok=all(r["graph_breaks"] == 0 for r in rows))


#: every check by its letter: a callable of (args, device) returning its JSON entry
CHECKS = dict(a=check_detectron2, b=check_mmseg, c=check_pretrain, d=check_throughput,
              e=check_branches, f=check_backbone, g=check_compile)


def run_checks(names, args, device, command: str, report: Callable[[str], None] = print) -> dict:
    """Run the checks ``names`` (letters of CHECKS); one that raises is recorded and the others still run.

    Args:
        names: the checks' letters.
        args: tools/gpu_check.py's parsed options.
        device: the ``torch.device`` checked.
        command: the command line, recorded in the result.
        report: called with a line as each check starts and with its verdict.

    Returns:
        The JSON: command, machine, PUBLISHED, each check's entry (``ok``, ``wall_s``, its figures, or
        its error and traceback) and ``ok`` when all are.
    """
    result = dict(command=command, machine=machine_record(device), published=PUBLISHED, checks={})
    for name in names:
        report(f"gpu_check: ({name}) {CHECKS[name].__name__} ...")
        started = time.time()
        try:
            entry = dict(dict(ok=True), **CHECKS[name](args, device))
        except Exception as e:  # one failing check does not hide the others' figures
            entry = dict(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        entry["wall_s"] = round(time.time() - started, 1)
        result["checks"][name] = entry
        verdict = ("skipped: " + entry["skipped"]) if "skipped" in entry else \
            "ok" if entry["ok"] else "FAILED: " + entry.get("error", "see its rows")
        report(f"gpu_check: ({name}) {verdict} in {entry['wall_s']} s")
    result["ok"] = all(entry["ok"] for entry in result["checks"].values())
    return result


def summary(result) -> dict:
    """The checks' entries as the tool prints them: without the tracebacks and every repeat's time."""
    return {name: {k: v for k, v in entry.items() if k not in ("traceback", "times_s")}
            for name, entry in result["checks"].items()}
