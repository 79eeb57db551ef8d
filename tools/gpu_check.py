#!/usr/bin/env python
"""The GPU check (``make gpu-check``): what a GPU user's run does, in one command and one JSON,
next to the published figures it should be read against.

    python tools/gpu_check.py                                   # one GPU, under 10 minutes
    python tools/gpu_check.py --device cpu --size 128 --steps 2 --checks a b c d e   # every check, CPU, small

(a) a Mask R-CNN training step of ``mask_rcnn_srvit_s_t3_win.py`` and ``mask_rcnn_srvit_s_t3.py``
    at 1024 through detectron2's AMPTrainer (fp16 autocast + GradScaler), as tools/train_net.py
    builds them: s/iter and peak memory, each paired with detectron2's own ViTDet ViT-B
    (``reference/mask_rcnn_vitdet_b.py``) stepped in the same run (the published 0.314 s/iter,
    10.9 GB on an A100 only where detectron2's model zoo is absent, and the JSON says so);
(b) an mmseg training step of ``upernet_srvit_s.py`` through its ``AmpOptimWrapper``;
(c) a pretraining step of tools/pretrain.py with ``--amp`` (fp16 + GradScaler on CUDA);
(d) tools/benchmark.py's inference img/s of SR-ViT-S T=3, DeiT-S and timm's ViT of depth D_eff
    at 224 (paired ratios), next to the paper's 943 and 2614 img/s (its GPU), with each model's
    MFU: achieved FLOP/s (2 x count_flops' multiply-adds x img/s) over the GPU's dense fp16 /
    bf16 peak (PEAK_TFLOPS; "unknown" for a GPU not in it);
(e) the device branches against the CPU: the relative-position attention's kernel and block
    choices of the GPU against the CPU's (fp32, 1e-5), and on a GPU a tiny windowed model's
    features and gradients on the GPU (fp32, fp16 and bf16 autocast) against the CPU's fp32;
(f) tools/benchmark.py's S-T3 backbone at --size, global and windowed, inference and training
    step, paired with timm's ViT of depth D_eff (vit_same_depth) and detectron2's ViTDet of the
    same applications (vitdet_same_depth).

Data are synthetic (images with boxes and masks, label maps, an ImageFolder of noise): the
check measures the code paths, speed and memory, not accuracy. On the CPU the frameworks'
AMP paths (AMPTrainer, AmpOptimWrapper) need CUDA, so (a) and (b) run in fp32 there and (c)
in bf16 where the CPU has it (``srvit_backbones.amp``). Without CUDA and without ``--device``
it says so, runs (e) with the GPU's choices forced on the CPU and exits 0.
"""
import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F

import srvit_backbones
from srvit_backbones import amp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DETECTORS = ("mask_rcnn_srvit_s_t3_win.py", "mask_rcnn_srvit_s_t3.py")
VITDET_B = "reference/mask_rcnn_vitdet_b.py"  # detectron2's model-zoo ViTDet ViT-B Mask R-CNN
#: dense fp16 / bf16 tensor-core peak without sparsity, TFLOP/s (NVIDIA datasheets; SXM parts),
#: matched in this order against torch.cuda.get_device_name: MFU's denominator
PEAK_TFLOPS = (("H100 PCIe", 756), ("H200", 989), ("H100", 989), ("A100", 312), ("L40S", 362), ("L4", 121),
               ("A10", 125), ("V100", 125))
SEGMENTOR = "upernet_srvit_s.py"
#: the figures each check is read against
PUBLISHED = dict(
    vitdet_vit_b=dict(s_per_iter=0.314, train_memory_gb=10.9, gpu="A100", images_per_gpu=1,
                      source="detectron2 projects/ViTDet model zoo, Mask R-CNN ViT-B (64 GPUs, batch 64)"),
    srvit_s_t3_224_img_per_s=dict(value=943, source="SR-ViT paper Table 3, its GPU"),
    deit_s_224_img_per_s=dict(value=2614, source="SR-ViT paper Table 3, its GPU"),
)


def _tool(name):
    """Another tools/ script, loaded by path (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"srvit_tool_{name}", os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Timer:
    """Seconds per step (the device synchronised around each) and the peak memory of the steps."""

    def __init__(self, device: torch.device):
        self.device, self.times = device, []
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self):
        self.sync()
        self._started = time.perf_counter()

    def stop(self):
        self.sync()
        self.times.append(time.perf_counter() - self._started)

    @contextlib.contextmanager
    def step(self):
        self.start()
        yield
        self.stop()

    def summary(self, warmup: int) -> dict:
        timed = self.times[warmup:] or self.times
        out = dict(s_per_iter=statistics.median(timed), times_s=self.times, warmup_steps=warmup)
        if self.device.type == "cuda":
            out["peak_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
        return out


# ---------------------------------------------------------------- (a) detectron2 Mask R-CNN, AMPTrainer
def check_detectron2(args, device):
    from detectron2.config import instantiate
    from detectron2.engine import AMPTrainer, HookBase, SimpleTrainer

    benchmark = _tool("benchmark")
    use_amp = device.type == "cuda"
    rows = []
    try:
        benchmark.detector_config(dict(name=VITDET_B, overrides=[], grad_checkpointing=False))
        configs, reference = (VITDET_B,) + DETECTORS, None
    except Exception as e:  # detectron2 without its model zoo configs
        configs, reference = DETECTORS, dict(PUBLISHED["vitdet_vit_b"], why=f"{VITDET_B} not built: {e}")
    for config in configs:
        opts = [f"model.backbone.net.img_size={args.size}", f"model.backbone.square_pad={args.size}",
                f"train.device={device}", f"train.amp.enabled={use_amp}"]
        cfg = benchmark._train_net().load_config(argparse.Namespace(config_file=config, opts=opts))
        model = instantiate(cfg.model).to(device)
        cfg.optimizer.params.model = model
        optimizer = instantiate(cfg.optimizer)
        batch = benchmark.synthetic_detection_batch(args.images_per_gpu, args.size)
        trainer = (AMPTrainer if use_amp else SimpleTrainer)(model, itertools.repeat(batch), optimizer)
        timer = Timer(device)

        class TimeSteps(HookBase):
            def before_step(self):
                timer.start()

            def after_step(self):
                timer.stop()

        trainer.register_hooks([TimeSteps()])
        trainer.train(0, args.warmup + args.steps)
        losses = trainer.storage.latest()
        rows.append(dict(config=config, size=args.size, images_per_gpu=args.images_per_gpu,
                         trainer=type(trainer).__name__, grad_scale=trainer.grad_scaler.get_scale() if use_amp else None,
                         total_loss=losses["total_loss"][0], **timer.summary(args.warmup)))
        del trainer, model, optimizer
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
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    from mmengine.structures import PixelData
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample

    import srvit_backbones.mmseg  # noqa: F401  (registers the backbone)
    from srvit_backbones.openmmlab.tools import sync_bn_to_bn

    cfg = Config.fromfile(srvit_backbones.resolve_config("mmseg", SEGMENTOR))
    size = args.size if args.size < 512 else 512  # the config's crop
    cfg.model.data_preprocessor.size = (size, size)
    cfg.model.backbone.img_size = (size, size)
    cfg.model.backbone.pop("init_cfg", None)  # no pretrained file: the step, not the accuracy
    if device.type == "cuda":
        if cfg.optim_wrapper.type != "AmpOptimWrapper":
            cfg.optim_wrapper.type = "AmpOptimWrapper"  # what a GPU user switches on
    else:
        cfg.optim_wrapper.type = "OptimWrapper"
        sync_bn_to_bn(cfg.model)  # SyncBN needs CUDA
    with DefaultScope.overwrite_default_scope("mmseg"):
        model = MODELS.build(cfg.model).to(device)
        model.init_weights()
        model.train()
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
        g = torch.Generator().manual_seed(0)
        inputs, samples = [], []
        for _ in range(args.images_per_gpu * 2):  # the config's 2 images per GPU (16 over 8)
            inputs.append(torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g))
            sample = SegDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size)))
            sample.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, size, size), generator=g))
            samples.append(sample)
        timer = Timer(device)
        for _ in range(args.warmup + args.steps):
            with timer.step():
                log = model.train_step(dict(inputs=inputs, data_samples=samples), wrapper)
    scale = wrapper.loss_scaler.get_scale() if hasattr(wrapper, "loss_scaler") else None
    return dict(config=SEGMENTOR, size=size, images=len(inputs), optim_wrapper=type(wrapper).__name__,
                loss_scale=scale, loss=float(log["loss"].detach()), **timer.summary(args.warmup))


# ---------------------------------------------------------------- (c) pretraining with --amp
def check_pretrain(args, device):
    from PIL import Image

    from srvit_backbones.pretrain import engine, recipe, trainer

    with tempfile.TemporaryDirectory() as root:
        g = torch.Generator().manual_seed(0)
        for split in ("train", "val"):
            for c in range(2):
                os.makedirs(os.path.join(root, split, f"class{c}"))
                for i in range(args.images_per_gpu * 2):
                    pixels = torch.randint(0, 256, (64, 64, 3), dtype=torch.uint8, generator=g).numpy()
                    Image.fromarray(pixels).save(os.path.join(root, split, f"class{c}", f"{i}.jpg"))
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

    argv = ["--model", "srvit_s_t3", "--size", "224", "--batch-size", str(args.throughput_batch), "--modes", "infer",
            "--references", "deit_small_patch16_224", "vit_same_depth", "--warmup", str(args.warmup),
            "--repeats", str(args.steps), "--device", str(device), "--amp", "on" if args.pretrain_amp else "off"]
    benchmark = _tool("benchmark")
    with contextlib.redirect_stdout(sys.stderr):
        result = benchmark.main(argv)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    rows = []
    for row in result["rows"]:
        model = benchmark.build(row["kind"], row["name"], 224, False).eval()
        gmacs = count_flops(model, (torch.randn(1, 3, 224, 224),)) / 1e9
        rows.append(dict(model=benchmark.label(row).rsplit(" ", 1)[0], img_per_s=row["img_per_s"],
                         median_s=row["median_s"], amp_dtype=row["amp_dtype"], batch_size=row["batch_size"],
                         **model_flops_utilisation(row["img_per_s"], gmacs, gpu)))
    ratios = [dict(a=c["a"], b=c["b"], time_ratio=c["median"], ci95=c["ci95"]) for c in result["comparisons"]]
    return dict(command="python tools/benchmark.py " + " ".join(argv), rows=rows, paired=ratios,
                reference=dict(srvit_s_t3=PUBLISHED["srvit_s_t3_224_img_per_s"],
                               deit_s=PUBLISHED["deit_s_224_img_per_s"]))


def peak_tflops(gpu_name):
    """The dense fp16 / bf16 peak of a GPU in PEAK_TFLOPS, or None."""
    return next((peak for key, peak in PEAK_TFLOPS if gpu_name and key in gpu_name), None)


def model_flops_utilisation(img_per_s, gmacs, gpu_name):
    """Achieved TFLOP/s (a multiply-add is two FLOPs) and its fraction of the GPU's peak."""
    achieved = 2 * gmacs * img_per_s / 1e3
    peak = peak_tflops(gpu_name)
    return dict(gmacs=gmacs, achieved_tflops=achieved, peak_tflops=peak or "unknown",
                mfu=achieved / peak if peak else None)


# ---------------------------------------------------------------- (e) device branches against the CPU
def _cosine(a, b):
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def kernel_under_both_choices(grid, window, block_elements=None, seed=0):
    """Outputs and gradients of ``rel_pos_attention`` on CPU tensors under the CPU's and the
    GPU's choices of kernel and block size: {"cpu": [out, *grads], "cuda": [out, *grads]}.
    ``window`` 0 attends over the whole grid; otherwise ``window_qkv`` pads to whole windows."""
    from srvit_backbones.models.rel_pos import rel_pos_attention
    from srvit_backbones.models.window import window_qkv

    heads, C = 2, 8
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(2, grid[0] * grid[1], 3 * heads * C, generator=g)
    if window:
        q, k, v = window_qkv(qkv, torch.randn(3 * heads * C, generator=g), grid, window, heads).unbind(0)
    else:
        q, k, v = qkv.view(2, -1, 3, heads, C).permute(2, 0, 3, 1, 4).unbind(0)
    size = (window, window) if window else grid
    inputs = [t.contiguous().requires_grad_() for t in (q, k, v)]
    inputs += [torch.randn(2 * n - 1, C, generator=g).mul_(0.3).requires_grad_() for n in size]
    results = {}
    for device_type in ("cpu", "cuda"):
        out = rel_pos_attention(*inputs, size, 0.0, block_elements, device_type=device_type)
        results[device_type] = [out, *torch.autograd.grad((out * out.detach().cos()).sum(), inputs)]
    return results


def check_branches(args, device):
    """The GPU's kernel and block choices against the CPU's on CPU tensors (always), and on a
    GPU the tiny windowed model's features and gradients there against the CPU's fp32."""
    rows = []
    for name, grid, window in (("padded_windows", (6, 7), 3), ("windows", (6, 6), 3), ("global", (9, 9), 0)):
        results = kernel_under_both_choices(grid, window)
        diff = max((a - b).abs().max().item() for a, b in zip(results["cuda"], results["cpu"]))
        rows.append(dict(case=f"rel-pos kernel, GPU choices on the CPU, {name}", max_abs_diff=diff,
                         tolerance=1e-5, ok=diff <= 1e-5))
    if device.type == "cuda":
        rows += model_on_device_against_cpu(device)
    return dict(rows=rows, ok=all(row["ok"] for row in rows))


def model_on_device_against_cpu(device):
    """A tiny windowed, relative-position model (padded windows, global applications) on
    ``device`` against the CPU: fp32 to 1e-4 (TF32 off, the caller's setting restored), fp16 /
    bf16 autocast by cosine. On the CPU it runs the same code (its autocast against its fp32)."""
    with tf32_off():
        return _compare_on_device(device)


@contextlib.contextmanager
def tf32_off():
    """TF32 off for an fp32 comparison, the caller's settings restored after it."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _compare_on_device(device):
    from srvit_backbones import SRViT

    torch.manual_seed(0)
    model = SRViT(img_size=112, embed_dim=64, num_heads=2, layout=(2, 1), num_steps=3, num_classes=0,
                  window_size=3, use_rel_pos=True)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    x = torch.randn(2, 3, 112, 112)

    def run(module, inputs, dtype=None):
        module.zero_grad()
        with amp.autocast(str(inputs.device), dtype is not None, dtype):
            features = module.forward_features(inputs)
        features.float().square().sum().backward()
        # copies: for fp32 CPU tensors .float().cpu() is the grad itself, which module.to(device) then moves
        return (features.detach().float().cpu().clone(),
                [p.grad.float().cpu().clone() for p in module.parameters() if p.grad is not None])

    ref_features, ref_grads = run(model, x)
    gpu = model.to(device)
    rows = []
    for dtype, out_min, grad_min in ((None, None, None), (torch.float16, 0.999, 0.99), (torch.bfloat16, 0.999, 0.99)):
        if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            continue
        features, grads = run(gpu, x.to(device), dtype)
        if dtype is None:
            diff = max((features - ref_features).abs().max().item(),
                       max((a - b).abs().max().item() / max(b.abs().max().item(), 1e-12) for a, b in zip(grads, ref_grads)))
            rows.append(dict(case=f"tiny windowed rel-pos model, {device.type} fp32 against CPU fp32", max_abs_diff=diff,
                             tolerance=1e-4, ok=diff <= 1e-4))
        else:
            cos_out = _cosine(features, ref_features)
            cos_grad = min(_cosine(a, b) for a, b in zip(grads, ref_grads))
            rows.append(dict(case=f"tiny windowed rel-pos model, {device.type} {str(dtype)[6:]} autocast against CPU fp32",
                             feature_cosine=cos_out, min_gradient_cosine=cos_grad,
                             ok=cos_out >= out_min and cos_grad >= grad_min))
    return rows


# ---------------------------------------------------------------- (f) the backbone beside its anchors
def check_backbone(args, device):
    """The backbone (S-T3) at --size, global and windowed (ViTDet's 14x14 windows, rel-pos), inference and
    training step, paired with vit_same_depth and vitdet_same_depth in interleaved rounds."""
    argv = ["--model", args.backbone, "--size", str(args.size), "--batch-size", str(args.images_per_gpu * 2),
            "--modes", "infer", "train", "--references", "vit_same_depth", "vitdet_same_depth",
            "--variant", "global:", "--variant", "win:window_size=14,use_rel_pos=True", "--warmup", str(args.warmup),
            "--repeats", str(args.steps), "--device", str(device), "--amp", "on" if device.type == "cuda" else "off"]
    with contextlib.redirect_stdout(sys.stderr):
        result = _tool("benchmark").main(argv)
    rows = [dict(model=_tool("benchmark").label(r), median_s=r["median_s"], peak_mib=r["peak_mib"]) for r in result["rows"]]
    ratios = [dict(a=c["a"], b=c["b"], time_ratio=c["median"], ci95=c["ci95"], peak_ratio=c["peak_ratio"])
              for c in result["comparisons"]]
    return dict(command="python tools/benchmark.py " + " ".join(argv), rows=rows, paired=ratios)


def machine_record(device):
    """What the figures were measured on: versions, GPU name, driver and clocks (nvidia-smi)."""
    import subprocess

    record = dict(platform=platform.platform(), torch=torch.__version__, cuda=torch.version.cuda,
                  device=str(device), srvit_backbones=srvit_backbones.__version__,
                  gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    if device.type == "cuda":
        query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
        try:
            out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
            record.update(zip(query.split(","), (v.strip() for v in out.split(","))))
        except (OSError, IndexError, subprocess.SubprocessError) as e:
            record["nvidia_smi"] = f"not available: {e}"
    return record


CHECKS = dict(a=check_detectron2, b=check_mmseg, c=check_pretrain, d=check_throughput, e=check_branches,
              f=check_backbone)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", help="default: cuda when a GPU is visible, else (e) only on the CPU")
    p.add_argument("--checks", nargs="+", choices=sorted(CHECKS), help="default: all on CUDA, e elsewhere")
    p.add_argument("--size", type=int, default=1024, help="detector input (mmseg: min(size, 512), pretraining 224)")
    p.add_argument("--images-per-gpu", type=int, default=1, help="detector images per step (ViTDet: 1 per GPU)")
    p.add_argument("--throughput-batch", type=int, default=64, help="(d): images per inference batch")
    p.add_argument("--backbone", default="srvit_s_t3", help="(f): the SR-ViT variant timed beside its anchors")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per check")
    p.add_argument("--steps", type=int, default=5, help="timed steps per check")
    p.add_argument("--no-amp", dest="pretrain_amp", action="store_false",
                   help="(c) and (d) in fp32 (on a CPU without native bf16)")
    p.add_argument("--output", default="output/gpu_check.json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.device is None:
        args.device = "cuda" if cuda else "cpu"
        if not cuda:
            print("gpu_check: no CUDA device here; running (e) only, the GPU's kernel and block choices forced on "
                  "the CPU. Run it on a GPU machine for (a)-(d).")
            args.checks = args.checks or ["e"]
    device = torch.device(args.device)
    if device.type == "cuda" and not cuda:
        sys.exit("gpu_check: --device cuda but no GPU is visible: drop --device to run (e) on the CPU")
    checks = args.checks or sorted(CHECKS)
    result = dict(command=" ".join(["tools/gpu_check.py"] + (argv if argv is not None else sys.argv[1:])),
                  machine=machine_record(device),
                  published=PUBLISHED, checks={})
    for name in checks:
        print(f"gpu_check: ({name}) {CHECKS[name].__name__} ...", flush=True)
        started = time.time()
        try:
            entry = dict(CHECKS[name](args, device), ok=True) if name != "e" else CHECKS[name](args, device)
        except (Exception, SystemExit) as e:  # one failing check does not hide the others' figures
            entry = dict(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        entry["wall_s"] = round(time.time() - started, 1)
        result["checks"][name] = entry
        print(f"gpu_check: ({name}) {'ok' if entry['ok'] else 'FAILED: ' + entry['error']} in {entry['wall_s']} s",
              flush=True)
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
