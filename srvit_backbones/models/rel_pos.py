"""ViTDet's decomposed relative positions (MViTv2's ``add_decomposed_rel_pos``) as an attention kernel: the tables'
names and resizing, and the four kernels of ``KERNELS``, chosen by ``choose_kernel`` per device type (docs/models.md;
docs/performance.md: the measurements behind the constants)."""
import contextlib
import functools
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function
from torch.utils.checkpoint import checkpoint

from .constants import size_constants

#: the (images, heads, queries, keys) bias block given to SDPA as its mask, in elements (24 MiB of fp32)
SDPA_BLOCK_ELEMENTS = 6 * 2 ** 20

#: fewer keys than this: on the CPU, matmul-softmax-matmul beats SDPA given a bias
SDPA_MIN_KEYS = 1024

#: the score block of matmul-softmax-matmul and of the backward pass, in elements (1 MiB: cache-sized)
MATMUL_BLOCK_ELEMENTS = 2 ** 18

#: off the CPU, the most bias elements one SDPA call of the ``bias`` kernel gets (256 MiB of fp16)
GPU_BIAS_ELEMENTS = 2 ** 27

#: the kernels ``rel_pos_attention`` can run (the module docstring says what each does)
KERNELS = ("blocked", "folded", "bias", "flex")

#: the head dims of CUDA's fused SDPA kernels are multiples of this
FUSED_HEAD_DIM_ALIGNMENT = 8

#: the largest q.k head dim at which ``folded`` keeps v at its own head dim (cuDNN's training limit); beyond, v is
#: zero-padded to the q.k head dim (flash's rule)
FOLDED_OWN_V_MAX_HEAD_DIM = 128

#: the names of the relative-position tables of a ``RelPosAttention`` (one (h, w) pair per extent)
REL_POS_SUFFIXES = ("rel_pos_h", "rel_pos_w")

#: precisions whose recomputing backward keeps float32 statistics (``_BlockedRelPosAttention``)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def autocast_off(device_type: str):
    """Autocast off for ``device_type``; a null context on a device type without autocast (meta tensors)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def is_rel_pos(name: str) -> bool:
    """Whether a parameter / state-dict key is a relative-position table."""
    return name.endswith(REL_POS_SUFFIXES)


def resize_rel_pos(table: torch.Tensor, length: int) -> torch.Tensor:
    """Resize an (L, C) table to ``length`` rows as detectron2's / timm's ``get_rel_pos`` does at run time (linear; the
    table itself where L == length), so that a table resized at load time gives the original's bias."""
    if table.shape[0] == length:
        return table
    resized = F.interpolate(table.T.unsqueeze(0).to(torch.promote_types(table.dtype, torch.float32)),
                            size=length, mode="linear")
    return resized.squeeze(0).T.to(table.dtype)


def _offsets(size: int, device: torch.device) -> torch.Tensor:
    """(size, size) index of query i and key j's offset, i - j + size - 1, made on ``device``."""
    coords = torch.arange(size, device=device)
    return coords[:, None] - coords[None, :] + (size - 1)


#: ``_offsets`` made once per extent and device (no host-to-device copy per application)
_cached_offsets = size_constants(_offsets)


def rel_pos_lookup(size: int, table: torch.Tensor) -> torch.Tensor:
    """timm's / ViTDet's ``get_rel_pos`` for equal query and key sizes: the (size, size, C) rows of every (query, key)
    offset, the table resized to 2 * size - 1 rows where it differs."""
    return resize_rel_pos(table, 2 * size - 1)[_cached_offsets(size, table.device)]


QueryBlock = Tuple[slice, slice]


def _query_blocks(batch: int, heads: int, rows: int, row_len: int, keys: int, budget: int) -> List[QueryBlock]:
    """(image, grid-row) slices of blocks of at most ``budget`` (images, heads, rows * row_len, keys) scores: whole
    images where they fit, else grid rows across as many images as fit (at least one row of every head)."""
    per_row = heads * row_len * keys
    if rows * per_row <= budget:
        step = max(1, budget // (rows * per_row))
        return [(slice(b0, min(b0 + step, batch)), slice(0, rows)) for b0 in range(0, batch, step)]
    images = min(batch, max(1, budget // per_row))
    step = max(1, budget // (images * per_row))
    return [(slice(b0, min(b0 + images, batch)), slice(r0, min(r0 + step, rows)))
            for b0 in range(0, batch, images) for r0 in range(0, rows, step)]


def _scratch(like: torch.Tensor, blocks: List[QueryBlock], heads: int, row_len: int, keys: int) -> torch.Tensor:
    """One flat buffer for every block's scores, reused: glibc maps a fresh large block anew each time."""
    return like.new_empty(max((b.stop - b.start) * (r.stop - r.start) for b, r in blocks) * heads * row_len * keys)


def _bias(terms_h: torch.Tensor, terms_w: torch.Tensor, block: QueryBlock,
          scratch: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The (images, heads, queries, keys) bias of a block; written into ``scratch`` where given (outside autograd)."""
    bs, rs = block
    rows_h, rows_w = terms_h[bs, :, rs, :, :, None], terms_w[bs, :, rs, :, None, :]
    b, heads, rows, q_w, k_h, _ = rows_h.shape
    shape = (b, heads, rows * q_w, k_h * rows_w.shape[-1])
    if scratch is None:
        return (rows_h + rows_w).contiguous().view(shape)
    out = scratch[:b * heads * rows * q_w * k_h * rows_w.shape[-1]].view(b, heads, rows, q_w, k_h, -1)
    return torch.add(rows_h, rows_w, out=out).view(shape)


def _scores_over_bias(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q.k / sqrt(C) + bias computed in place over the (consumed) ``bias`` buffer: no second (queries, keys) tensor."""
    b, heads, n, C = q.shape
    scores = bias.view(b * heads, n, -1)
    scores.baddbmm_(q.reshape(b * heads, n, C), k.transpose(-2, -1).reshape(b * heads, C, -1), alpha=C ** -0.5)
    return scores.view(bias.shape)


def check_kernel(kernel: Optional[str]) -> Optional[str]:
    """``kernel`` if it is one of ``KERNELS`` or None (the device type's choice), else a ValueError naming them."""
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"unknown relative-position kernel {kernel!r}: choose one of {KERNELS}, or None for the "
                         f"default choice (choose_kernel)")
    return kernel


def choose_kernel(device_type: str, kernel: Optional[str] = None) -> str:
    """The kernel of one attention call: ``kernel`` if given, else ``blocked`` on the CPU, ``folded`` elsewhere.

    Args:
        device_type: the device type the call runs on, or runs the choices of ('cuda' on CPU tensors).
        kernel: one of ``KERNELS`` to force, or None.

    Raises:
        ValueError: ``kernel`` is not one of ``KERNELS``.
    """
    return check_kernel(kernel) or ("blocked" if device_type == "cpu" else "folded")


def bias_calls(maps: int, queries: int, keys: int, budget: int = GPU_BIAS_ELEMENTS) -> int:
    """How many SDPA calls the ``bias`` kernel makes for ``maps`` (images x heads) maps of (queries, keys): one while
    the whole bias fits ``budget``, else as few calls of whole maps as fit it (one map at least)."""
    return -(-maps // max(1, budget // (queries * keys)))


def blocks_take_sdpa(device_type: str, dtype: torch.dtype, keys: int, dropout_p: float) -> bool:
    """Whether the ``blocked`` kernel's forward blocks take SDPA (their bias as ``attn_mask``)
    rather than matmul-softmax-matmul: off the CPU, and there for attention dropout, low
    precision and SDPA_MIN_KEYS keys and more."""
    return bool(dropout_p) or device_type != "cpu" or keys >= SDPA_MIN_KEYS or \
        dtype not in (torch.float32, torch.float64)


def default_block_elements(device_type: str, sdpa: bool) -> int:
    """The score block of a pass not given one: cache-sized for the CPU's matmuls, else SDPA_BLOCK_ELEMENTS."""
    return SDPA_BLOCK_ELEMENTS if sdpa or device_type != "cpu" else MATMUL_BLOCK_ELEMENTS


def backward_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The recomputing backward's matmul dtype: the inputs' on a GPU, float32 for fp16 / bf16 on the CPU."""
    return torch.float32 if device_type == "cpu" and dtype in LOW_PRECISION else dtype


def _blocked_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms_h: torch.Tensor,
                     terms_w: torch.Tensor, budget: Optional[int], device_type: str, dropout_p: float = 0.0,
                     autograd: bool = False) -> torch.Tensor:
    """The output block by block; with ``autograd``, each block's bias a tensor of its own (not the buffer)."""
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
    """The ``blocked`` kernel's training form: it keeps q, k, v, the per-axis terms and the output, and recomputes each
    block's probabilities in ``backward`` (as FlashAttention does). Inputs of one dtype; autocast off in both passes."""

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
    """The gradients of q, k, v and the per-axis terms, block by block, the probabilities recomputed; for fp16 / bf16
    the probabilities and the terms' gradients are float32 (FlashAttention's split)."""
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
        # summed, then copied: an ``out=`` into a strided slice breaks torch.compile's graph
        dterms_h[bs, :, rs] = dscores.sum(-1)
        dterms_w[bs, :, rs] = dscores.sum(-2)
    return dq, dk, dv, dterms_h, dterms_w


def _sdpa_with_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms_h: torch.Tensor,
                    terms_w: torch.Tensor) -> torch.Tensor:
    """One SDPA call over (..., queries, C) maps with their whole (..., queries, keys) bias."""
    bias = (terms_h[..., None] + terms_w[..., None, :]).flatten(-2).flatten(-3, -2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def _whole_bias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms_h: torch.Tensor,
                          terms_w: torch.Tensor, budget: int, needs_grad: bool) -> torch.Tensor:
    """The ``bias`` kernel in ``bias_calls`` calls of whole (image, head) maps, each checkpointed in training where
    there are several (SDPA's memory-efficient kernel keeps the bias it is given)."""
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
    """(q.k, v) head dims of the ``folded`` kernel's SDPA call: q.k carries the channels and one term per key row and
    key column, aligned; v keeps its own aligned head dim up to FOLDED_OWN_V_MAX_HEAD_DIM, beyond it q.k's."""
    def align(n):
        return -(-n // FUSED_HEAD_DIM_ALIGNMENT) * FUSED_HEAD_DIM_ALIGNMENT

    qk = align(head_dim + size[0] + size[1])
    return qk, align(head_dim) if qk <= FOLDED_OWN_V_MAX_HEAD_DIM else qk


def _folded_constants(head_dim: int, size: Tuple[int, int], qk_dim: int, dtype: torch.dtype,
                      table_dtype: torch.dtype, device: torch.device):
    """The ``folded`` kernel's constants of a grid: the gather index that turns q @ [scale * I | R_h^T | R_w^T | 0] into
    q' (queries, qk_dim); the keys' zero-padded row and column one-hots (keys, qk_dim - head_dim) in ``dtype``; and the
    projection's constant blocks [scale * I] and [0] in ``table_dtype``."""
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
    """The ``folded`` kernel: q' from one matmul of q with [scale * I | R_h^T | R_w^T | 0] and one gather."""
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
    """The ``flex`` kernel: the per-axis terms added in ``score_mod`` (no backward on the CPU, where it is eager)."""
    B, heads, N, _ = q.shape
    k_w = terms_w.shape[-1]
    rows, cols = terms_h.reshape(B, heads, N, -1), terms_w.reshape(B, heads, N, -1)

    def add_terms(score, b, h, q_idx, kv_idx):
        return score + rows[b, h, q_idx, kv_idx // k_w] + cols[b, h, q_idx, kv_idx % k_w]

    return _flex_attention(device_type != "cpu")(q, k, v, score_mod=add_terms)


def attention_dtype(device_type: str, *tensors: torch.Tensor) -> torch.dtype:
    """The dtype attention computes in: autocast's where it is on, else the inputs' promoted dtype (a ``q_norm``
    LayerNorm gives float32 q and k next to an fp16 v under CUDA autocast)."""
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
    """Attention over a grid's tokens with ViTDet's decomposed relative positions (the bias of query i and key j is
    q_i . R_h[row_i - row_j] + q_i . R_w[col_i - col_j]). A leaf for FX.

    Args:
        q, k, v: (B, heads, h*w, C) tokens, cast to ``attention_dtype``.
        rel_pos_h, rel_pos_w: the (height, width) tables, resized where their length differs.
        size: the (h, w) grid.
        dropout_p: attention dropout (``bias`` and ``flex`` leave such calls to ``blocked``).
        block_elements: the most scores of a ``blocked`` block (default ``default_block_elements``) or bias elements
            of a ``bias`` call (default GPU_BIAS_ELEMENTS).
        device_type: whose kernel and block choices apply (default: the inputs'; 'cuda' on CPU tensors).
        kernel: one of ``KERNELS``, or None for ``choose_kernel``'s.

    Returns:
        The (B, heads, h*w, C) output in the computing dtype.

    Raises:
        ValueError: ``kernel`` is not one of ``KERNELS``.
    """
    device_type = device_type or q.device.type
    kernel = choose_kernel(device_type, kernel)
    dtype = attention_dtype(device_type, q, k, v)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    B, heads, N, C = q.shape
    q_h, q_w = size
    with autocast_off(device_type):
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, rel_pos_h, rel_pos_w))
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
