"""``tools/benchmark.py --attention``: the relative-position attention kernels beside flash attention
and detectron2's formula, forward and training step timed apart, with launches, saved memory and
errors against detectron2's formula (docs/tools.md)."""
import functools
import statistics

import torch
import torch.nn.functional as F

from ...models.rel_pos import KERNELS, rel_pos_attention
from .launches import count_launches
from .timing import Timer, cosine

#: the precisions the attention mode times on each device type
ATTENTION_DTYPES = {"cuda": ("float16", "bfloat16"), "cpu": ("float32", "bfloat16")}
ATTENTION_HEADS, ATTENTION_HEAD_DIM, VITDET_WINDOW = 6, 64, 14  # SR-ViT-S, ViTDet's windows


def detectron2_formula(q, k, v, rel_pos_h, rel_pos_w, size):
    """ViTDet's attention with detectron2's ``add_decomposed_rel_pos``: the reference of every kernel."""
    from detectron2.modeling.backbone.utils import add_decomposed_rel_pos

    B, heads, N, C = q.shape
    qf, kf = q.reshape(B * heads, N, C), k.reshape(B * heads, N, C)
    attn = add_decomposed_rel_pos((qf * C ** -0.5) @ kf.transpose(-2, -1), qf, rel_pos_h, rel_pos_w, size, size)
    return (attn.softmax(dim=-1) @ v.reshape(B * heads, N, C)).view(B, heads, N, C)


def attention_kernels():
    """name -> f(q, k, v, rel_pos_h, rel_pos_w, grid): ours (default and each of ``KERNELS``) and the references."""
    kernels = {"flash, no bias": lambda q, k, v, h, w, size: F.scaled_dot_product_attention(q, k, v),
               "detectron2 formula": detectron2_formula,
               "ours (default choice)": rel_pos_attention}
    kernels.update({f"ours: {name}": functools.partial(rel_pos_attention, kernel=name) for name in KERNELS})
    return kernels


def attention_cases(size, batch_size):
    """(case, maps, grid) of the global grid of ``size`` and of its (padded) 14x14 windows."""
    side = size // 16
    windows = (-(-side // VITDET_WINDOW)) ** 2
    return [("global", batch_size, (side, side)), ("windows", batch_size * windows, (VITDET_WINDOW,) * 2)]


def attention_inputs(images, grid, device, dtype):
    """[q, k, v in ``dtype``, float32 tables] on ``device``, requiring gradients, and a fixed output gradient."""
    g = torch.Generator().manual_seed(0)
    shape = (images, ATTENTION_HEADS, grid[0] * grid[1], ATTENTION_HEAD_DIM)
    qkv = [torch.randn(shape, generator=g).to(device, dtype) for _ in range(3)]
    tables = [torch.randn(2 * side - 1, ATTENTION_HEAD_DIM, generator=g).mul_(0.1).to(device) for side in grid]
    grad_out = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    return [t.requires_grad_() for t in qkv + tables], grad_out


def call_attention(fn, tensors, grid, device):
    """One call, under autocast for fp16 / bf16 inputs (as the model runs them)."""
    with torch.autocast(device.type, dtype=tensors[0].dtype, enabled=tensors[0].dtype != torch.float32):
        return fn(*tensors, grid)


def forward(fn, tensors, grid, device):
    """The forward alone, without autograd (inference)."""
    with torch.no_grad():
        return call_attention(fn, [t.detach() for t in tensors], grid, device)


def training_step(fn, tensors, grid, device, grad_out):
    """Forward, then backward from ``grad_out``: the inputs' gradients (None where one does not reach)."""
    out = call_attention(fn, tensors, grid, device)
    return torch.autograd.grad(out, tensors, grad_out.to(out.dtype), allow_unused=True)


def saved_for_backward_mib(fn, tensors, grid, device):
    """What autograd keeps of one call for its backward (distinct storages), in MiB."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        call_attention(fn, tensors, grid, device)
    return sum(storages.values()) / 2 ** 20


def error_text(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:500]


def count_into(row, key, fn, *args):
    """``row[key]``: the launches of ``fn(*args)``, or None with ``launches_error`` (flex runs under no
    dispatch mode)."""
    try:
        row[key] = count_launches(fn, *args).total
    except Exception as e:
        row[key], row["launches_error"] = None, error_text(e)


def check_kernel(row, fn, tensors, grad_out, reference, reference_grads, grid, device):
    """Fill ``row`` with a kernel's untimed figures (cosines, launches, saved and peak memory, or
    ``forward_backward_error``); whether its training step runs."""
    row["output_cosine"] = cosine(forward(fn, tensors, grid, device), reference)
    count_into(row, "forward_launches", forward, fn, tensors, grid, device)
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        grads = training_step(fn, tensors, grid, device, grad_out)
        if device.type == "cuda":
            row["peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2 ** 20
    except Exception as e:  # flex has no backward on the CPU
        row["forward_backward_error"] = error_text(e)
        return False
    row["gradient_cosines"] = [None if g is None else cosine(g, e) for g, e in zip(grads, reference_grads)]
    count_into(row, "forward_backward_launches", training_step, fn, tensors, grid, device, grad_out)
    row["saved_mib"] = saved_for_backward_mib(fn, tensors, grid, device)
    return True


def attention_rows(size, batch_size, device, warmup, repeats):
    """Rows of every kernel on every case of ``size`` (``batch_size`` images) in each of ATTENTION_DTYPES:
    checked once, then forward and training step timed apart in ``warmup + repeats`` interleaved rounds.
    A kernel that raises gets its ``error`` and leaves the rounds."""
    device = torch.device(device)
    kernels = attention_kernels()
    rows = []
    for case, images, grid in attention_cases(size, batch_size):
        fp32, fp32_grad_out = attention_inputs(images, grid, device, torch.float32)
        reference = call_attention(detectron2_formula, fp32, grid, device)
        reference_grads = torch.autograd.grad(reference, fp32, fp32_grad_out)
        reference = reference.detach()
        for dtype_name in ATTENTION_DTYPES[device.type]:
            dtype = getattr(torch, dtype_name)
            tensors, grad_out = attention_inputs(images, grid, device, dtype)
            group = []
            for name, fn in kernels.items():
                row = dict(case=case, images=images, grid=list(grid), heads=ATTENTION_HEADS, dtype=dtype_name,
                           kernel=name, forward_s=None, forward_backward_s=None)
                rows.append(row)
                try:
                    trains = check_kernel(row, fn, tensors, grad_out, reference, reference_grads, grid, device)
                except Exception as e:  # e.g. a kernel that does not compile on this machine
                    row["error"] = error_text(e)
                    continue
                group.append((row, fn, trains, Timer(device, reset_peak=False), Timer(device, reset_peak=False)))
            for r in range(warmup + repeats):
                for entry in list(group if r % 2 == 0 else reversed(group)):
                    row, fn, trains, forward_timer, step_timer = entry
                    try:
                        with forward_timer.step():
                            forward(fn, tensors, grid, device)
                        if trains:
                            with step_timer.step():
                                training_step(fn, tensors, grid, device, grad_out)
                    except Exception as e:
                        row["error"] = error_text(e)
                        group.remove(entry)
            for row, _, trains, forward_timer, step_timer in group:
                row["forward_s"] = forward_timer.times[warmup:]
                row["forward_backward_s"] = step_timer.times[warmup:] if trains else None
    return rows


def report_attention(rows):
    print(f"{'case':<8} {'dtype':<9} {'kernel':<22} {'fwd ms':>8} {'launches':>8} {'fwd+bwd ms':>11} {'launches':>8} "
          f"{'saved MiB':>10} {'peak MiB':>9} {'out cos':>9} {'min grad cos':>12}")
    for r in rows:
        head = f"{r['case']:<8} {r['dtype']:<9} {r['kernel']:<22}"
        if "error" in r:
            print(f"{head} failed: {r['error']}")
            continue
        fb = f"{statistics.median(r['forward_backward_s']) * 1e3:>11.2f}" if r["forward_backward_s"] else f"{'-':>11}"
        grads = [c for c in r.get("gradient_cosines") or [] if c is not None]
        launches = [f"{'-' if r.get(key) is None else r[key]:>8}"
                    for key in ("forward_launches", "forward_backward_launches")]
        print(f"{head} {statistics.median(r['forward_s']) * 1e3:>8.2f} {launches[0]} {fb} "
              f"{launches[1]} {r.get('saved_mib', float('nan')):>10.1f} "
              f"{r.get('peak_mib', float('nan')):>9.1f} {r['output_cosine']:>9.5f} "
              f"{min(grads) if grads else float('nan'):>12.5f}")
        for key, what in (("forward_backward_error", "forward+backward failed"),
                          ("launches_error", "launches not counted")):
            if key in r:
                print(f"{'':<41} {what}: {r[key]}")
    print("\nfwd: the forward alone (no autograd); fwd+bwd: a training step (forward, then backward from a given "
          "gradient); launches: the aten operations of one call that do work (launches.LaunchCounter); cosines "
          "against detectron2's formula in float32 (flash has no relative positions: its gap is the bias's "
          "weight); saved: what a training step keeps for the backward; peak: GPU only")
