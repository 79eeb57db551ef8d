"""The attention mode (``tools/benchmark.py --attention``): the relative-position attention
kernels one by one (``srvit_backbones.models.rel_pos.KERNELS`` and the default choice) beside
flash attention without a bias, detectron2's formula and SDPA with a materialised bias, for
the global grid of a size and its 14x14 windows: forward and forward+backward times, what a
training step keeps for the backward, GPU peak memory, and each output's and gradient's
error against detectron2's formula."""
import functools
import statistics

import torch
import torch.nn.functional as F

from ..models.rel_pos import KERNELS, rel_pos_attention
from .timing import Timer, cosine

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
    kernels = {"flash, no bias": lambda q, k, v, h, w, size: F.scaled_dot_product_attention(q, k, v),
               "detectron2 formula": detectron2_formula,
               "ours (default choice)": rel_pos_attention}
    kernels.update({f"ours: {name}": functools.partial(rel_pos_attention, kernel=name) for name in KERNELS})
    return kernels


def attention_cases(size, batch_size):
    """(case, attention maps' images, grid): the global grid of ``size`` and its windows of 14x14
    (the grid padded to whole windows, as ViTDet does) for ``batch_size`` images."""
    side = size // 16
    windows = (-(-side // VITDET_WINDOW)) ** 2
    return [("global", batch_size, (side, side)), ("windows", batch_size * windows, (VITDET_WINDOW,) * 2)]


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


def attention_rows(size, batch_size, device, warmup, repeats):
    """Every kernel of ``attention_kernels`` on every case of ``attention_cases`` in each of
    ATTENTION_DTYPES: forward and forward+backward times in interleaved rounds (alternating
    order), what training keeps, GPU peak memory, and errors against detectron2's formula in
    float32."""
    device = torch.device(device)
    kernels = attention_kernels()
    rows = []
    for case, images, grid in attention_cases(size, batch_size):
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
                           kernel=name)
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
                group.append((row, fn, trains, Timer(device, reset_peak=False), Timer(device, reset_peak=False)))
            for r in range(warmup + repeats):
                for row, fn, trains, forward, backward in (group if r % 2 == 0 else reversed(group)):
                    with forward.step(), torch.no_grad():
                        call_attention(fn, [t.detach() for t in tensors], grid, device)
                    if trains:
                        with backward.step():
                            attention_gradients(call_attention(fn, tensors, grid, device), tensors, device)
            for row, _, trains, forward, backward in group:
                row["forward_s"] = forward.times[warmup:]
                row["forward_backward_s"] = [f + b for f, b in zip(forward.times, backward.times)][warmup:] \
                    if trains else None
            rows += [row for row, *_ in group]
    return rows


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
