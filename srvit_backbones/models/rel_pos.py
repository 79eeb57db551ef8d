"""ViTDet's decomposed relative positions (MViTv2's ``add_decomposed_rel_pos``) as an attention
kernel: the tables' names and resizing, and attention whose bias is expanded block by block of
query rows, with a backward that recomputes each block's probabilities instead of keeping any
(queries, keys) tensor. The relative-position lookup is timm's copy of ViTDet's
(``get_rel_pos``), reused by import. Which kernel and block size run is a function of the
device type and dtype, so the GPU's choices run on the CPU too (``device_type='cuda'``).
"""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function
from timm.models.vision_transformer_sam import get_rel_pos

#: the (images, heads, queries, keys) bias block given to the fused kernel, in elements:
#: 24 MiB of fp32 (4 grid rows of a global application at 1024, 6 heads), under glibc's largest
#: mmap threshold (32 MiB); the whole bias would be 384 MiB per global application at 1024
FUSED_BLOCK_ELEMENTS = 6 * 2 ** 20

#: fewer keys than this: on the CPU, matmul-softmax-matmul beats the fused kernel when it is
#: given a bias (25 windows of 14x14, 6 heads, 2 threads: 29 ms against 33 ms; 18 ms without
#: relative positions)
FUSED_MIN_KEYS = 1024

#: the score block of matmul-softmax-matmul and of the backward pass, in elements (1 MiB; at
#: least one grid row, 6 MiB in a global application at 1024): small enough that its
#: probabilities stay in cache between the softmax and the next matmul
UNFUSED_BLOCK_ELEMENTS = 2 ** 18

#: the names of the relative-position tables of a ``RelPosAttention`` (one (h, w) pair per extent)
REL_POS_SUFFIXES = ("rel_pos_h", "rel_pos_w")


def is_rel_pos(name: str) -> bool:
    """Whether a parameter / state-dict key is a relative-position table."""
    return name.endswith(REL_POS_SUFFIXES)


def resize_rel_pos(table: torch.Tensor, length: int) -> torch.Tensor:
    """A (L, C) relative-position table resized to (length, C) by the linear interpolation
    detectron2's / timm's ``get_rel_pos`` applies at run time, so that a table resized when a
    checkpoint is loaded gives the bias the original table would have given."""
    if table.shape[0] == length:
        return table
    resized = F.interpolate(table.T.unsqueeze(0).float(), size=length, mode="linear")
    return resized.squeeze(0).T.to(table.dtype)


QueryBlock = Tuple[slice, slice]


def _query_blocks(batch: int, heads: int, rows: int, row_len: int, keys: int, budget: int) -> List[QueryBlock]:
    """(image, grid-row) slices of blocks whose (images, heads, rows * row_len, keys) scores
    hold at most ``budget`` elements: whole images where they fit, else groups of grid rows of
    one image (at least one row of every head: blocks split by heads were slower, measured)."""
    per_row = heads * row_len * keys
    if rows * per_row <= budget:
        step = max(1, budget // (rows * per_row))
        return [(slice(b0, min(b0 + step, batch)), slice(0, rows)) for b0 in range(0, batch, step)]
    step = max(1, budget // per_row)
    return [(slice(b, b + 1), slice(r0, min(r0 + step, rows))) for b in range(batch) for r0 in range(0, rows, step)]


def _scratch(like: torch.Tensor, blocks: List[QueryBlock], heads: int, row_len: int, keys: int) -> torch.Tensor:
    """One flat buffer for every block's scores: glibc hands a freed block of more than its
    mmap threshold back to the kernel, and a fresh block each time is faulted in anew (a global
    application at 1024, measured: 32k page faults, 83 ms instead of 16 ms to build its bias)."""
    return like.new_empty(max((b.stop - b.start) * (r.stop - r.start) for b, r in blocks) * heads * row_len * keys)


def _bias(rel_h: torch.Tensor, rel_w: torch.Tensor, block: QueryBlock, scratch: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The (images, heads, queries, keys) bias of a block: rel_h + rel_w over the key grid;
    written into ``scratch`` where given (outside autograd)."""
    bs, rs = block
    rows_h, rows_w = rel_h[bs, :, rs, :, :, None], rel_w[bs, :, rs, :, None, :]
    b, heads, rows, q_w, k_h, _ = rows_h.shape
    shape = (b, heads, rows * q_w, k_h * rows_w.shape[-1])
    if scratch is None:
        return (rows_h + rows_w).contiguous().view(shape)
    bias = scratch[:b * heads * rows * q_w * k_h * rows_w.shape[-1]].view(b, heads, rows, q_w, k_h, -1)
    return torch.add(rows_h, rows_w, out=bias).view(shape)


def _scores(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax's input q.k / sqrt(C) + bias, written into ``bias``."""
    b, heads, n, C = q.shape
    scores = bias.view(b * heads, n, -1)
    scores.baddbmm_(q.reshape(b * heads, n, C), k.transpose(-2, -1).reshape(b * heads, C, -1), alpha=C ** -0.5)
    return bias


def uses_fused_kernel(device_type: str, dtype: torch.dtype, keys: int, dropout_p: float) -> bool:
    """Whether the forward blocks take the fused kernel (their bias as ``attn_mask``) rather
    than matmul-softmax-matmul: everywhere but on the CPU, and there for attention dropout, low
    precision and grids of FUSED_MIN_KEYS keys and more. A function of the device *type*, so
    that the GPU's choices run (and are tested) on the CPU too."""
    return bool(dropout_p) or device_type != "cpu" or keys >= FUSED_MIN_KEYS or \
        dtype not in (torch.float32, torch.float64)


def default_block_elements(device_type: str, fused: bool) -> int:
    """The score block of a pass that is not given one: cache-sized for matmul-softmax-matmul
    on the CPU (forward and the recomputing backward), FUSED_BLOCK_ELEMENTS for the fused kernel
    and on any other device, where each block costs kernel launches."""
    return FUSED_BLOCK_ELEMENTS if fused or device_type != "cpu" else UNFUSED_BLOCK_ELEMENTS


#: precisions whose backward is recomputed in float32 (``_RelPosAttention``)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def _rel_pos_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_h: torch.Tensor, rel_w: torch.Tensor,
                     budget: Optional[int], device_type: str, dropout_p: float = 0.0,
                     autograd: bool = False) -> torch.Tensor:
    """The output block by block, in the inputs' dtype; with ``autograd``, differentiable by
    autograd (each block's bias a tensor of its own instead of the reused buffer)."""
    B, heads, N, _ = q.shape
    q_h, q_w = rel_h.shape[2:4]
    keys = k.shape[2]
    fused = uses_fused_kernel(device_type, q.dtype, keys, dropout_p)
    blocks = _query_blocks(B, heads, q_h, q_w, keys, budget or default_block_elements(device_type, fused))
    scratch = None if autograd else _scratch(q, blocks, heads, q_w, keys)
    out = v.new_empty(q.shape[:-1] + v.shape[-1:])
    for block in blocks:
        bs, rs = block
        qs = slice(rs.start * q_w, rs.stop * q_w)
        q_c, k_c, v_c, bias = q[bs, :, qs], k[bs], v[bs], _bias(rel_h, rel_w, block, scratch)
        if fused:
            out[bs, :, qs] = F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=bias, dropout_p=dropout_p)
        else:
            out[bs, :, qs] = torch.matmul(_scores(q_c, k_c, bias).softmax(-1), v_c)
    return out


class _RelPosAttention(torch.autograd.Function):
    """Attention with a decomposed relative-position bias that keeps no (queries, keys) tensor
    for the backward pass: it saves q, k, v, the per-axis terms and the output (what the fused
    kernels keep) and recomputes each block's probabilities in ``backward``, as
    FlashAttention does. Autograd through ``F.scaled_dot_product_attention`` with a bias that
    needs a gradient keeps at least every block's bias instead (384 MiB per global application
    at 1024, fp32; the test of what is saved shows it).

    Every input has one dtype (``rel_pos_attention`` casts them), and autocast is off inside
    both passes: the forward runs in that dtype; the backward of fp16 / bf16 inputs works in
    float32 (probabilities recomputed per block as FlashAttention keeps its softmax statistics)
    and returns gradients in the inputs' dtype."""

    @staticmethod
    def forward(ctx, q, k, v, rel_h, rel_w, budget: Optional[int], device_type: str):
        dtypes = {t.dtype for t in (q, k, v, rel_h, rel_w)}
        if len(dtypes) != 1:
            raise TypeError(f"_RelPosAttention takes inputs of one dtype, got {sorted(map(str, dtypes))}: call "
                            f"rel_pos_attention, which casts them")
        with torch.autocast(device_type=device_type, enabled=False):
            out = _rel_pos_forward(q, k, v, rel_h, rel_w, budget, device_type)
        ctx.save_for_backward(q, k, v, rel_h, rel_w, out)
        ctx.budget, ctx.device_type = budget, device_type
        return out

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        dtype = saved[0].dtype
        work = torch.float32 if dtype in LOW_PRECISION else dtype
        with torch.autocast(device_type=ctx.device_type, enabled=False):
            grads = _rel_pos_backward(*(t.to(work) for t in saved), grad_out.to(work), ctx.budget, ctx.device_type)
        return (*(g.to(dtype) for g in grads), None, None)


def _rel_pos_backward(q, k, v, rel_h, rel_w, out, grad_out, budget: Optional[int], device_type: str):
    """The gradients of q, k, v and the per-axis terms, block by block, each block's
    probabilities recomputed from q, k and the terms."""
    B, heads, N, C = q.shape
    q_h, q_w, k_h = rel_h.shape[2:]
    keys = k.shape[2]
    grad_out = grad_out.contiguous()
    blocks = _query_blocks(B, heads, q_h, q_w, keys, budget or default_block_elements(device_type, fused=False))
    # blocks of grid rows share their images' keys: their dk, dv add up; whole images' are written once
    accumulate = blocks[0][1].stop < q_h
    new, zeros_or_empty = dict(dtype=q.dtype, device=q.device), torch.zeros if accumulate else torch.empty
    dq, dk, dv = torch.empty(q.shape, **new), zeros_or_empty(k.shape, **new), zeros_or_empty(v.shape, **new)
    drel_h, drel_w = torch.empty(rel_h.shape, **new), torch.empty(rel_w.shape, **new)
    delta = (grad_out * out).sum(-1, keepdim=True)
    scratch = _scratch(q, blocks, heads, q_w, keys)
    for block in blocks:
        bs, rs = block
        qs = slice(rs.start * q_w, rs.stop * q_w)
        q_c, k_c, v_c, go = q[bs, :, qs], k[bs], v[bs], grad_out[bs, :, qs]
        b, h, n = q_c.shape[:3]
        probs = _scores(q_c, k_c, _bias(rel_h, rel_w, block, scratch)).softmax(-1)
        dv[bs].view(b * h, keys, -1).baddbmm_(probs.view(b * h, n, keys).transpose(1, 2), go.reshape(b * h, n, -1),
                                             beta=int(accumulate))
        dscores = torch.matmul(go, v_c.transpose(-2, -1)).sub_(delta[bs, :, qs]).mul_(probs)
        del probs
        dscores_bmm = dscores.view(b * h, n, keys)
        if accumulate:  # the block's rows of dq are strided over heads: a matmul into them is slower
            dq[bs, :, qs] = torch.matmul(dscores, k_c).mul_(C ** -0.5)
        else:
            dq[bs].view(b * h, n, C).baddbmm_(dscores_bmm, k_c.reshape(b * h, keys, C), beta=0, alpha=C ** -0.5)
        dk[bs].view(b * h, keys, C).baddbmm_(dscores_bmm.transpose(1, 2), q_c.reshape(b * h, n, C),
                                             beta=int(accumulate), alpha=C ** -0.5)
        dscores = dscores.view(b, h, rs.stop - rs.start, q_w, k_h, -1)
        torch.sum(dscores, -1, out=drel_h[bs, :, rs])
        torch.sum(dscores, -2, out=drel_w[bs, :, rs])
    return dq, dk, dv, drel_h, drel_w


def attention_dtype(device_type: str, *tensors: torch.Tensor) -> torch.dtype:
    """The dtype attention computes in: autocast's for the device where it is on (as
    ``F.scaled_dot_product_attention`` would be cast), else the inputs' promoted dtype (a
    ``q_norm`` LayerNorm gives float32 q and k next to an fp16 v under CUDA autocast)."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


@register_notrace_function
def rel_pos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_pos_h: torch.Tensor,
                      rel_pos_w: torch.Tensor, size: Tuple[int, int], dropout_p: float = 0.0,
                      block_elements: Optional[int] = None, device_type: Optional[str] = None) -> torch.Tensor:
    """Attention over (B, heads, h*w, C) tokens of a (h, w) grid with ViTDet's decomposed
    relative positions (MViTv2's ``add_decomposed_rel_pos``: the bias of query i and key j is
    q_i . R_h[row_i - row_j] + q_i . R_w[col_i - col_j]). timm's
    ``get_decomposed_rel_pos_bias`` builds the whole (queries, keys) bias at once; here the
    per-axis terms are computed once and the bias is expanded for blocks of whole grid rows
    (``block_elements`` scores at most; by default ``default_block_elements``), so a global
    application at 1024 never holds a 4096x4096 bias per head, and training keeps none
    (``_RelPosAttention``, in every precision). Attention dropout takes autograd through the
    fused kernel, block by block.

    The inputs are cast to ``attention_dtype`` (autocast's where it is on). ``device_type``
    (default: the inputs') chooses the kernel and block sizes (``uses_fused_kernel``,
    ``default_block_elements``): 'cuda' on CPU tensors runs the GPU's choices on the CPU.
    A leaf for FX: the blocks are a Python loop over the grid's size."""
    device_type = device_type or q.device.type
    dtype = attention_dtype(device_type, q, k, v)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    B, heads, N, C = q.shape
    q_h, q_w = size
    r_q = q.reshape(B, heads, q_h, q_w, C)
    with torch.autocast(device_type=device_type, enabled=False):
        # contiguous (einsum returns them permuted), so that each block's bias is made in one pass
        rel_h = torch.einsum("bnhwc,hkc->bnhwk", r_q, get_rel_pos(q_h, q_h, rel_pos_h).to(dtype)).contiguous()
        rel_w = torch.einsum("bnhwc,wkc->bnhwk", r_q, get_rel_pos(q_w, q_w, rel_pos_w).to(dtype)).contiguous()
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, rel_h, rel_w))
        if needs_grad and not dropout_p:
            return _RelPosAttention.apply(q, k, v, rel_h, rel_w, block_elements, device_type)
        return _rel_pos_forward(q, k, v, rel_h, rel_w, block_elements, device_type, dropout_p, autograd=needs_grad)
