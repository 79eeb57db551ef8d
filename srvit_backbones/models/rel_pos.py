"""ViTDet's decomposed relative positions (MViTv2's ``add_decomposed_rel_pos``) as an attention
kernel: the tables' names and resizing, and four ways to attend with them (``KERNELS``):

- ``blocked``: the bias expanded block by block of query rows (SDPA, i.e.
  ``F.scaled_dot_product_attention`` with the block's bias as its mask, or
  matmul-softmax-matmul per block), with a backward that recomputes each block's probabilities
  instead of keeping any (queries, keys) tensor: memory-lean at any grid size, a Python loop of
  blocks (the CPU's kernel, tuned there);
- ``folded``: no bias at all. The bias of query i and key j is a sum of per-axis terms,
  terms_h[i, row(j)] + terms_w[i, col(j)], so it folds exactly into the dot product: the query
  gets its terms appended (q' = [q * scale, terms_h, terms_w]), the key the one-hot of its row
  and column (k' = [k, onehot(row j), onehot(col j)]), and one SDPA call with ``scale=1`` and no
  mask attends; the tables' gradients come out of dq' through autograd. Without a mask the
  call qualifies for CUDA's fused kernels (cuDNN, flash) in training, and no (queries, keys)
  tensor exists in either direction (the GPU's kernel, ``choose_kernel``);
- ``bias``: SDPA with the whole bias of whole (image, head) maps, differentiated by autograd
  (CUDA's memory-efficient kernel returns the bias gradient): one call, its bias kept for the
  backward, up to GPU_BIAS_ELEMENTS; beyond, a few calls of whole maps, each checkpointed (its
  bias rebuilt and its call rerun in the backward), so nothing of (queries, keys) size is kept;
- ``flex``: ``flex_attention`` with a ``score_mod`` adding the per-axis terms (kept in float32).

The rule (``choose_kernel``): ``blocked`` on the CPU, ``folded`` elsewhere; ``bias`` and
``flex`` are selectable per call (``kernel=``), by ``set_rel_pos_kernel`` or by the environment
variable SRVIT_REL_POS_KERNEL. It is a function of the device type, so the GPU's choices run on
the CPU too (``device_type='cuda'``).
"""
import contextlib
import functools
import os
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function
from torch.utils.checkpoint import checkpoint

from .constants import size_constants

#: the (images, heads, queries, keys) bias block given to SDPA as its mask, in elements:
#: 24 MiB of fp32 (4 grid rows of a global application at 1024, 6 heads), under glibc's largest
#: mmap threshold (32 MiB); the whole bias would be 384 MiB per global application at 1024
SDPA_BLOCK_ELEMENTS = 6 * 2 ** 20

#: fewer keys than this: on the CPU, matmul-softmax-matmul beats SDPA when it is
#: given a bias (25 windows of 14x14, 6 heads, 2 threads: 29 ms against 33 ms; 18 ms without
#: relative positions)
SDPA_MIN_KEYS = 1024

#: the score block of matmul-softmax-matmul and of the backward pass, in elements (1 MiB; at
#: least one grid row, 6 MiB in a global application at 1024): small enough that its
#: probabilities stay in cache between the softmax and the next matmul
MATMUL_BLOCK_ELEMENTS = 2 ** 18

#: off the CPU, the most bias elements that one SDPA call gets and that autograd keeps for the
#: backward of one application: 256 MiB of fp16 / bf16 (the GPU's training dtypes). ViTDet's
#: 14x14 windows at 1024 (25 windows x 6 heads: 5.8M elements per image) take one call, kept, up
#: to 23 images; the global 64x64 grid (16.8M per map, 6 maps per image) one call at batch 1,
#: 2 checkpointed calls of 6 maps at batch 2 (12 per call at most). What a call holds at once, its bias and in the backward
#: the bias gradient, stays within 512 MiB of fp16 (1 GiB of fp32), under 1.5% of an 80 GiB GPU;
#: half the budget would double the calls of a global grid at batch 2 and beyond
GPU_BIAS_ELEMENTS = 2 ** 27

#: the kernels ``rel_pos_attention`` can run (the module docstring says what each does)
KERNELS = ("blocked", "folded", "bias", "flex")

#: the head dims of CUDA's fused SDPA kernels are multiples of this (fp16 / bf16: flash pads
#: q, k and v to it with copies, the memory-efficient and cuDNN kernels refuse other sizes)
FUSED_HEAD_DIM_ALIGNMENT = 8

#: the largest q.k head dim with which the ``folded`` kernel keeps v at its own head dim:
#: cuDNN trains with head dims (q.k, v) up to (128, 128); beyond, flash needs q, k and v of one
#: head dim (up to 256), so v is zero-padded to the q.k head dim (the global 64x64 grid at 1024:
#: 64 + 64 + 64 = 192, where cuDNN's backward takes (192, 128) on some versions only)
FOLDED_OWN_V_MAX_HEAD_DIM = 128

#: the names of the relative-position tables of a ``RelPosAttention`` (one (h, w) pair per extent)
REL_POS_SUFFIXES = ("rel_pos_h", "rel_pos_w")


def autocast_off(device_type: str):
    """Autocast switched off for ``device_type``; nothing to switch off on a device type without
    autocast (meta tensors, on which whole models run shapes only to count their operations)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def is_rel_pos(name: str) -> bool:
    """Whether a parameter / state-dict key is a relative-position table."""
    return name.endswith(REL_POS_SUFFIXES)


def resize_rel_pos(table: torch.Tensor, length: int) -> torch.Tensor:
    """A (L, C) relative-position table resized to (length, C) by the linear interpolation
    detectron2's / timm's ``get_rel_pos`` applies at run time, so that a table resized when a
    checkpoint is loaded gives the bias the original table would have given."""
    if table.shape[0] == length:
        return table
    resized = F.interpolate(table.T.unsqueeze(0).to(torch.promote_types(table.dtype, torch.float32)),
                            size=length, mode="linear")
    return resized.squeeze(0).T.to(table.dtype)


def _offsets(size: int, device: torch.device) -> torch.Tensor:
    """(size, size) index of query i and key j's offset, i - j + size - 1, made on ``device``."""
    coords = torch.arange(size, device=device)
    return coords[:, None] - coords[None, :] + (size - 1)


#: ``_offsets`` made once per extent and device (made per call on the host, as timm's
#: ``get_rel_pos`` does, the index costs a host-to-device copy and a stream sync per application)
_cached_offsets = size_constants(_offsets)


def rel_pos_lookup(size: int, table: torch.Tensor) -> torch.Tensor:
    """(size, size, C) table rows of every (query, key) offset along one axis: timm's / ViTDet's
    ``get_rel_pos`` for equal query and key sizes, the table resized to 2 * size - 1 rows
    where it has another length. A compiled graph makes its index itself."""
    return resize_rel_pos(table, 2 * size - 1)[_cached_offsets(size, table.device)]


QueryBlock = Tuple[slice, slice]


def _query_blocks(batch: int, heads: int, rows: int, row_len: int, keys: int, budget: int) -> List[QueryBlock]:
    """(image, grid-row) slices of blocks whose (images, heads, rows * row_len, keys) scores
    hold at most ``budget`` elements: groups of whole images where they fit, else groups of
    grid rows across as many images as fit (one launch serves several images; at least one row
    of every head: blocks split by heads were slower, measured)."""
    per_row = heads * row_len * keys
    if rows * per_row <= budget:
        step = max(1, budget // (rows * per_row))
        return [(slice(b0, min(b0 + step, batch)), slice(0, rows)) for b0 in range(0, batch, step)]
    images = min(batch, max(1, budget // per_row))
    step = max(1, budget // (images * per_row))
    return [(slice(b0, min(b0 + images, batch)), slice(r0, min(r0 + step, rows)))
            for b0 in range(0, batch, images) for r0 in range(0, rows, step)]


def _scratch(like: torch.Tensor, blocks: List[QueryBlock], heads: int, row_len: int, keys: int) -> torch.Tensor:
    """One flat buffer for every block's scores: glibc hands a freed block of more than its
    mmap threshold back to the kernel, and a fresh block each time is faulted in anew (a global
    application at 1024, measured: 32k page faults, 83 ms instead of 16 ms to build its bias)."""
    return like.new_empty(max((b.stop - b.start) * (r.stop - r.start) for b, r in blocks) * heads * row_len * keys)


def _bias(terms_h: torch.Tensor, terms_w: torch.Tensor, block: QueryBlock,
          scratch: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The (images, heads, queries, keys) bias of a block: the height term + the width term
    over the key grid; written into ``scratch`` where given (outside autograd)."""
    bs, rs = block
    rows_h, rows_w = terms_h[bs, :, rs, :, :, None], terms_w[bs, :, rs, :, None, :]
    b, heads, rows, q_w, k_h, _ = rows_h.shape
    shape = (b, heads, rows * q_w, k_h * rows_w.shape[-1])
    if scratch is None:
        return (rows_h + rows_w).contiguous().view(shape)
    out = scratch[:b * heads * rows * q_w * k_h * rows_w.shape[-1]].view(b, heads, rows, q_w, k_h, -1)
    return torch.add(rows_h, rows_w, out=out).view(shape)


def _scores_over_bias(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax's input, q.k / sqrt(C) + bias, computed in place over the (consumed) ``bias``
    buffer, which then holds the scores: no second (queries, keys) tensor."""
    b, heads, n, C = q.shape
    scores = bias.view(b * heads, n, -1)
    scores.baddbmm_(q.reshape(b * heads, n, C), k.transpose(-2, -1).reshape(b * heads, C, -1), alpha=C ** -0.5)
    return scores.view(bias.shape)


def set_rel_pos_kernel(kernel: Optional[str]) -> Optional[str]:
    """Run ``kernel`` (one of ``KERNELS``) wherever it can run, instead of ``choose_kernel``'s
    default; None restores the default. Returns the setting it replaces, for the caller to put
    back. The environment variable SRVIT_REL_POS_KERNEL sets it at import."""
    global _forced_kernel
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"unknown relative-position kernel {kernel!r}: choose one of {KERNELS}, or None for the "
                         f"default choice (choose_kernel)")
    previous, _forced_kernel = _forced_kernel, kernel
    return previous


_forced_kernel: Optional[str] = None
set_rel_pos_kernel(os.environ.get("SRVIT_REL_POS_KERNEL") or None)


def choose_kernel(device_type: str, dropout_p: float, needs_grad: bool) -> str:
    """The kernel of one attention call: ``blocked`` on the CPU (the kernel tuned there; also for
    attention dropout, which it runs block by block); elsewhere ``folded``, whatever the sizes and
    the dropout. Why ``folded`` on a GPU, from CUDA's SDPA dispatch emulated on the CPU
    (tests/cuda_dispatch.py; ViTDet at 1024, S-T3, fp16, a training step of
    one application): it gives SDPA no mask, so the call trains on cuDNN (14x14 windows, head
    dims (96, 64)) or flash (the global 64x64 grid, (192, 192)) and keeps no (queries, keys)
    tensor, where ``bias`` trains on the memory-efficient kernel with a bias that needs a
    gradient (the 196-key window bias padded to a stride of 8 with copies; the global grid at
    batch 2 in 2 checkpointed calls, its bias built twice) and ``flex`` compiles a kernel per
    shape. A forced kernel (``set_rel_pos_kernel``, SRVIT_REL_POS_KERNEL) applies where it can
    run: ``flex`` has no dropout and no backward on the CPU, so those calls take ``blocked``; the
    other kernels run anywhere. A function of the device *type*, so that the GPU's choices run
    (and are tested) on the CPU."""
    if _forced_kernel == "flex":
        return "blocked" if dropout_p or (needs_grad and device_type == "cpu") else "flex"
    if _forced_kernel == "bias" and dropout_p:
        return "blocked"
    if _forced_kernel:
        return _forced_kernel
    return "blocked" if device_type == "cpu" else "folded"


def bias_calls(maps: int, queries: int, keys: int, budget: int = GPU_BIAS_ELEMENTS) -> int:
    """How many SDPA calls the ``bias`` kernel makes for ``maps`` (images x heads) maps of
    (queries, keys): one while the whole bias has at most ``budget`` elements (autograd keeps
    it), else as few calls of whole maps as fit it (each checkpointed: nothing of (queries,
    keys) size is kept), at least one map per call."""
    return -(-maps // max(1, budget // (queries * keys)))


def blocks_take_sdpa(device_type: str, dtype: torch.dtype, keys: int, dropout_p: float) -> bool:
    """Whether the ``blocked`` kernel's forward blocks take SDPA (their bias as
    ``attn_mask``) rather than matmul-softmax-matmul: everywhere but on the CPU, and there for
    attention dropout, low precision and grids of SDPA_MIN_KEYS keys and more."""
    return bool(dropout_p) or device_type != "cpu" or keys >= SDPA_MIN_KEYS or \
        dtype not in (torch.float32, torch.float64)


def default_block_elements(device_type: str, sdpa: bool) -> int:
    """The score block of a pass that is not given one: cache-sized for matmul-softmax-matmul
    on the CPU (forward and the recomputing backward), SDPA_BLOCK_ELEMENTS for SDPA
    and on any other device, where each block costs kernel launches."""
    return SDPA_BLOCK_ELEMENTS if sdpa or device_type != "cpu" else MATMUL_BLOCK_ELEMENTS


#: precisions whose recomputing backward keeps float32 statistics (``_BlockedRelPosAttention``)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def backward_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the recomputing backward's matmuls: the inputs' own on a GPU (tensor cores,
    float32 accumulation), float32 for fp16 / bf16 on the CPU, whose low-precision matmuls are
    slow; the softmax statistics and the bias gradients are float32 in either case."""
    return torch.float32 if device_type == "cpu" and dtype in LOW_PRECISION else dtype


def _blocked_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms_h: torch.Tensor,
                     terms_w: torch.Tensor, budget: Optional[int], device_type: str, dropout_p: float = 0.0,
                     autograd: bool = False) -> torch.Tensor:
    """The output block by block, in the inputs' dtype; with ``autograd``, differentiable by
    autograd (each block's bias a tensor of its own instead of the reused buffer)."""
    B, heads, N, _ = q.shape
    q_h, q_w = terms_h.shape[2:4]
    keys = k.shape[2]
    sdpa = blocks_take_sdpa(device_type, q.dtype, keys, dropout_p)
    blocks = _query_blocks(B, heads, q_h, q_w, keys, budget or default_block_elements(device_type, sdpa))
    scratch = None if autograd else _scratch(q, blocks, heads, q_w, keys)
    out = v.new_empty(q.shape[:-1] + v.shape[-1:])
    for block in blocks:
        bs, rs = block
        qs = slice(rs.start * q_w, rs.stop * q_w)
        q_c, k_c, v_c, bias = q[bs, :, qs], k[bs], v[bs], _bias(terms_h, terms_w, block, scratch)
        if sdpa:
            out[bs, :, qs] = F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=bias, dropout_p=dropout_p)
        else:
            out[bs, :, qs] = torch.matmul(_scores_over_bias(q_c, k_c, bias).softmax(-1), v_c)
    return out


class _BlockedRelPosAttention(torch.autograd.Function):
    """The ``blocked`` kernel's training form: it keeps no (queries, keys) tensor for the
    backward pass, but q, k, v, the per-axis terms and the output (what SDPA's flash and memory-efficient kernels keep),
    and recomputes each block's probabilities in ``backward``, as FlashAttention does. Autograd
    through ``F.scaled_dot_product_attention`` with a bias that needs a gradient keeps at least
    every block's bias instead (384 MiB per global application at 1024, fp32; the test of what
    is saved shows it).

    Every input has one dtype (``rel_pos_attention`` casts them), and autocast is off inside
    both passes: the forward runs in that dtype, the backward's matmuls in ``backward_dtype``,
    and the gradients return in the inputs' dtype."""

    @staticmethod
    def forward(ctx, q, k, v, terms_h, terms_w, budget: Optional[int], device_type: str):
        dtypes = {t.dtype for t in (q, k, v, terms_h, terms_w)}
        if len(dtypes) != 1:
            raise TypeError(f"_BlockedRelPosAttention takes inputs of one dtype, got {sorted(map(str, dtypes))}: call "
                            f"rel_pos_attention, which casts them")
        with autocast_off(device_type):
            out = _blocked_forward(q, k, v, terms_h, terms_w, budget, device_type)
        ctx.save_for_backward(q, k, v, terms_h, terms_w, out)
        ctx.budget, ctx.device_type = budget, device_type
        return out

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        dtype = saved[0].dtype
        work = backward_dtype(ctx.device_type, dtype)
        with autocast_off(ctx.device_type):
            grads = _blocked_backward(*(t.to(work) for t in saved), grad_out.to(work), ctx.budget, ctx.device_type)
        return (*(g.to(dtype) for g in grads), None, None)


def _blocked_backward(q, k, v, terms_h, terms_w, out, grad_out, budget: Optional[int], device_type: str):
    """The gradients of q, k, v and the per-axis terms, block by block, each block's
    probabilities recomputed from q, k and the terms. Matmuls run in the inputs' dtype; for
    fp16 / bf16 inputs the probabilities, their gradient and the terms' gradients are float32
    (FlashAttention's split), cast down only to enter a matmul."""
    B, heads, N, C = q.shape
    q_h, q_w, k_h = terms_h.shape[2:]
    keys = k.shape[2]
    stats = torch.promote_types(q.dtype, torch.float32)
    low = stats != q.dtype
    grad_out = grad_out.contiguous()
    blocks = _query_blocks(B, heads, q_h, q_w, keys, budget or default_block_elements(device_type, sdpa=False))
    # blocks of grid rows share their images' keys: their dk, dv add up; whole images' are written once
    accumulate = blocks[0][1].stop < q_h
    new, zeros_or_empty = dict(dtype=q.dtype, device=q.device), torch.zeros if accumulate else torch.empty
    dq, dk, dv = torch.empty(q.shape, **new), zeros_or_empty(k.shape, **new), zeros_or_empty(v.shape, **new)
    dterms_h = torch.empty(terms_h.shape, dtype=stats, device=q.device)
    dterms_w = torch.empty(terms_w.shape, dtype=stats, device=q.device)
    delta = (grad_out.to(stats) * out.to(stats)).sum(-1, keepdim=True)
    scratch = _scratch(q, blocks, heads, q_w, keys)
    for block in blocks:
        bs, rs = block
        qs = slice(rs.start * q_w, rs.stop * q_w)
        q_c, k_c, v_c, go = q[bs, :, qs], k[bs], v[bs], grad_out[bs, :, qs]
        b, h, n = q_c.shape[:3]
        probs = _scores_over_bias(q_c, k_c, _bias(terms_h, terms_w, block, scratch)).softmax(-1, dtype=stats)
        dv[bs].view(b * h, keys, -1).baddbmm_(probs.to(q.dtype).view(b * h, n, keys).transpose(1, 2),
                                             go.reshape(b * h, n, -1), beta=int(accumulate))
        dscores = torch.matmul(go, v_c.transpose(-2, -1)).to(stats).sub_(delta[bs, :, qs]).mul_(probs)
        del probs
        dscores_mm = dscores.to(q.dtype) if low else dscores
        dscores_bmm = dscores_mm.view(b * h, n, keys)
        if accumulate:  # the block's rows of dq are strided over heads: a matmul into them is slower
            dq[bs, :, qs] = torch.matmul(dscores_mm, k_c).mul_(C ** -0.5)
        else:
            dq[bs].view(b * h, n, C).baddbmm_(dscores_bmm, k_c.reshape(b * h, keys, C), beta=0, alpha=C ** -0.5)
        dk[bs].view(b * h, keys, C).baddbmm_(dscores_bmm.transpose(1, 2), q_c.reshape(b * h, n, C),
                                             beta=int(accumulate), alpha=C ** -0.5)
        dscores = dscores.view(b, h, rs.stop - rs.start, q_w, k_h, -1)
        # summed, then copied: a block of grid rows is a strided slice, and an ``out=`` into one
        # breaks torch.compile's graph
        dterms_h[bs, :, rs] = dscores.sum(-1)
        dterms_w[bs, :, rs] = dscores.sum(-2)
    return dq, dk, dv, dterms_h, dterms_w


def _sdpa_with_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms_h: torch.Tensor,
                    terms_w: torch.Tensor) -> torch.Tensor:
    """One SDPA call over (..., queries, C) maps with their whole (..., queries, keys) bias, the
    height term + the width term over the key grid."""
    bias = (terms_h[..., None] + terms_w[..., None, :]).flatten(-2).flatten(-3, -2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def _whole_bias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms_h: torch.Tensor,
                          terms_w: torch.Tensor, budget: int, needs_grad: bool) -> torch.Tensor:
    """The ``bias`` kernel in ``bias_calls`` calls: one call with the whole bias, which autograd
    differentiates and keeps; or the (image, head) maps split into a few calls of whole maps
    (4D, as SDPA's fused kernels take them), each checkpointed in training (the backward
    rebuilds its bias and reruns it: SDPA's memory-efficient kernel keeps the bias it is given)."""
    B, heads, N, C = q.shape
    maps = B * heads
    calls = bias_calls(maps, N, k.shape[2], budget)
    if calls == 1:
        return _sdpa_with_bias(q, k, v, terms_h, terms_w)
    per_call = -(-maps // calls)
    chunks = zip(*(t.reshape(maps, 1, *t.shape[2:]).split(per_call) for t in (q, k, v, terms_h, terms_w)))
    if needs_grad:
        outs = [checkpoint(_sdpa_with_bias, *chunk, use_reentrant=False, preserve_rng_state=False)
                for chunk in chunks]
    else:
        outs = [_sdpa_with_bias(*chunk) for chunk in chunks]
    return torch.cat(outs).view(B, heads, N, -1)


def folded_head_dims(head_dim: int, size: Tuple[int, int]) -> Tuple[int, int]:
    """The (q.k, v) head dims of the ``folded`` kernel's SDPA call for ``head_dim`` channels over
    a (h, w) grid: q.k carries the channels and one term per key row and key column, padded to
    FUSED_HEAD_DIM_ALIGNMENT; v keeps its own (aligned) head dim up to FOLDED_OWN_V_MAX_HEAD_DIM,
    beyond which it takes the q.k head dim (flash's rule). ViTDet at 1024, heads of 64: windows
    of 14x14 (96, 64), the global 64x64 grid (192, 192)."""
    def align(n):
        return -(-n // FUSED_HEAD_DIM_ALIGNMENT) * FUSED_HEAD_DIM_ALIGNMENT

    qk = align(head_dim + size[0] + size[1])
    return qk, align(head_dim) if qk <= FOLDED_OWN_V_MAX_HEAD_DIM else qk


def _folded_constants(head_dim: int, size: Tuple[int, int], qk_dim: int, dtype: torch.dtype,
                      table_dtype: torch.dtype, device: torch.device):
    """What the ``folded`` kernel needs of a grid besides q, k, v and the tables, made from sizes
    alone: the gather index that turns q @ [scale * I | R_h^T | R_w^T | 0] into q' (the channels,
    then for each key row r the table row of offset row(i) - r, for each key column c that of
    col(i) - c, then the zero column for the padding), (queries, qk_dim); the keys' one-hots of
    row and column, zero-padded, (keys, qk_dim - head_dim), in the keys' ``dtype``; and
    [scale * I] and [0], the projection's constant blocks, in the tables' ``table_dtype``."""
    h, w = size
    rows, cols = torch.arange(h, device=device), torch.arange(w, device=device)
    row_of, col_of = rows.repeat_interleave(w), cols.repeat(h)  # token n's row and column
    table_h, table_w = 2 * h - 1, 2 * w - 1
    pad = qk_dim - head_dim - h - w
    index = torch.cat([torch.arange(head_dim, device=device).expand(h * w, head_dim),
                       head_dim + row_of[:, None] - rows[None, :] + h - 1,
                       head_dim + table_h + col_of[:, None] - cols[None, :] + w - 1,
                       torch.full((h * w, pad), head_dim + table_h + table_w, device=device)], dim=1)
    onehots = torch.cat([row_of[:, None] == rows[None, :], col_of[:, None] == cols[None, :],
                         torch.zeros(h * w, pad, dtype=torch.bool, device=device)], dim=1).to(dtype)
    scaled_identity = torch.eye(head_dim, dtype=table_dtype, device=device) * head_dim ** -0.5
    return index, onehots, scaled_identity, torch.zeros(head_dim, 1, dtype=table_dtype, device=device)


#: ``_folded_constants`` made once per geometry, dtypes and device
_cached_folded_constants = size_constants(_folded_constants)


def _folded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_pos_h: torch.Tensor,
                      rel_pos_w: torch.Tensor, size: Tuple[int, int], dropout_p: float) -> torch.Tensor:
    """The ``folded`` kernel: the relative positions folded into q' . k' (the module docstring
    says how), one SDPA call with ``scale=1`` and no mask. q' comes out of one matmul of q with
    [scale * I | R_h^T | R_w^T | 0] (the resized tables, cast to q's dtype) and one gather, so
    the tables are never looked up per (query, key) pair; the tables' and q's gradients flow back
    through the gather and the matmul."""
    B, heads, N, C = q.shape
    qk_dim, v_dim = folded_head_dims(C, size)
    tables = [resize_rel_pos(t, 2 * n - 1) for t, n in zip((rel_pos_h, rel_pos_w), size)]
    index, onehots, scaled_identity, zero = _cached_folded_constants(C, tuple(size), qk_dim, k.dtype, tables[0].dtype,
                                                                     q.device)
    projection = torch.cat([scaled_identity, tables[0].T, tables[1].T, zero], dim=1).to(q.dtype)
    q_folded = torch.matmul(q, projection).gather(-1, index.expand(B, heads, N, qk_dim))
    k_folded = torch.cat([k, onehots.expand(B, heads, N, qk_dim - C)], dim=-1)
    v_padded = F.pad(v, (0, v_dim - C)) if v_dim != C else v
    out = F.scaled_dot_product_attention(q_folded, k_folded, v_padded, dropout_p=dropout_p, scale=1.0)
    return out[..., :C] if v_dim != C else out


@functools.lru_cache(maxsize=None)
def _flex_attention(compiled: bool):
    """``flex_attention``, compiled where it runs for speed (eager flex materialises the scores)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


def _flex_rel_pos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms_h: torch.Tensor,
                            terms_w: torch.Tensor, device_type: str) -> torch.Tensor:
    """The ``flex`` kernel: the per-axis terms added in ``flex_attention``'s ``score_mod``
    (gradients reach them on a GPU; flex has no backward on the CPU, where it runs eagerly)."""
    B, heads, N, _ = q.shape
    k_w = terms_w.shape[-1]
    rows, cols = terms_h.reshape(B, heads, N, -1), terms_w.reshape(B, heads, N, -1)

    def add_terms(score, b, h, q_idx, kv_idx):
        return score + rows[b, h, q_idx, kv_idx // k_w] + cols[b, h, q_idx, kv_idx % k_w]

    return _flex_attention(device_type != "cpu")(q, k, v, score_mod=add_terms)


def attention_dtype(device_type: str, *tensors: torch.Tensor) -> torch.dtype:
    """The dtype attention computes in: autocast's for the device where it is on (as
    ``F.scaled_dot_product_attention`` would be cast), else the inputs' promoted dtype (a
    ``q_norm`` LayerNorm gives float32 q and k next to an fp16 v under CUDA autocast)."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


@register_notrace_function
def rel_pos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_pos_h: torch.Tensor,
                      rel_pos_w: torch.Tensor, size: Tuple[int, int], dropout_p: float = 0.0,
                      block_elements: Optional[int] = None, device_type: Optional[str] = None,
                      kernel: Optional[str] = None) -> torch.Tensor:
    """Attention over (B, heads, h*w, C) tokens of a (h, w) grid with ViTDet's decomposed
    relative positions (MViTv2's ``add_decomposed_rel_pos``: the bias of query i and key j is
    q_i . R_h[row_i - row_j] + q_i . R_w[col_i - col_j]). ``kernel`` (default:
    ``choose_kernel``'s) says how the bias meets the scores (see ``KERNELS``). The ``folded``
    kernel folds it into q' . k' and attends in one SDPA call without a mask (attention dropout
    included). The others compute the per-axis terms once; the ``blocked`` kernel expands it for blocks of whole grid rows
    (``block_elements`` scores at most; by default ``default_block_elements``), so a global
    application at 1024 never holds a 4096x4096 bias per head, and training keeps none
    (``_BlockedRelPosAttention``, in every precision). Attention dropout takes autograd through SDPA,
    block by block. The ``bias`` kernel gives SDPA the whole bias of ``block_elements`` elements
    at most per call (by default GPU_BIAS_ELEMENTS; ``bias_calls``).

    The inputs are cast to ``attention_dtype`` (autocast's where it is on). ``device_type``
    (default: the inputs') chooses the kernel and block sizes: 'cuda' on CPU tensors runs the
    GPU's choices on the CPU. A leaf for FX: the blocks are a Python loop over the grid's size."""
    device_type = device_type or q.device.type
    dtype = attention_dtype(device_type, q, k, v)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    B, heads, N, C = q.shape
    q_h, q_w = size
    with autocast_off(device_type):
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, rel_pos_h, rel_pos_w))
        kernel = kernel or choose_kernel(device_type, dropout_p, needs_grad)
        if kernel == "folded":
            return _folded_attention(q, k, v, rel_pos_h, rel_pos_w, size, dropout_p)
        # flex adds its terms to float32 scores, and differentiates them with atomics in their dtype
        terms_dtype = torch.float32 if kernel == "flex" and not dropout_p else dtype
        r_q = q.reshape(B, heads, q_h, q_w, C).to(terms_dtype)
        # contiguous (einsum returns them permuted), so that each block's bias is made in one pass
        terms_h = torch.einsum("bnhwc,hkc->bnhwk", r_q, rel_pos_lookup(q_h, rel_pos_h).to(terms_dtype)).contiguous()
        terms_w = torch.einsum("bnhwc,wkc->bnhwk", r_q, rel_pos_lookup(q_w, rel_pos_w).to(terms_dtype)).contiguous()
        if kernel == "bias" and not dropout_p:
            return _whole_bias_attention(q, k, v, terms_h, terms_w, block_elements or GPU_BIAS_ELEMENTS, needs_grad)
        if kernel == "flex" and not dropout_p:
            return _flex_rel_pos_attention(q, k, v, terms_h, terms_w, device_type)
        if needs_grad and not dropout_p:
            return _BlockedRelPosAttention.apply(q, k, v, terms_h, terms_w, block_elements, device_type)
        return _blocked_forward(q, k, v, terms_h, terms_w, block_elements, device_type, dropout_p, autograd=needs_grad)
