"""ViTDet-style window attention and decomposed relative positions for SR-ViT's blocks.

A shared block runs at several depths, so whether an attention is windowed is a property
of the *application* (``SoftMoRUnit.window_sizes``), not of the block. Windows are ViTDet's
(detectron2's ``window_partition``: the grid padded at the bottom and right to whole windows),
partitioned after the qkv projection so that the padding is not projected (``window_qkv``);
the relative-position lookup is timm's copy of ViTDet's (``get_rel_pos``), reused by import.
Windows and relative positions work on patch tokens only: a model that uses them carries no
class token.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention, register_notrace_function
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


Block = Tuple[slice, slice]


def _blocks(batch: int, heads: int, rows: int, row_len: int, keys: int, budget: int) -> List[Block]:
    """(image, grid-row) slices of blocks whose (images, heads, rows * row_len, keys) scores
    hold at most ``budget`` elements: whole images where they fit, else groups of grid rows of
    one image (at least one row of every head: blocks split by heads were slower, measured)."""
    per_row = heads * row_len * keys
    if rows * per_row <= budget:
        step = max(1, budget // (rows * per_row))
        return [(slice(b0, min(b0 + step, batch)), slice(0, rows)) for b0 in range(0, batch, step)]
    step = max(1, budget // per_row)
    return [(slice(b, b + 1), slice(r0, min(r0 + step, rows))) for b in range(batch) for r0 in range(0, rows, step)]


def _scratch(like: torch.Tensor, blocks: List[Block], heads: int, row_len: int, keys: int) -> torch.Tensor:
    """One flat buffer for every block's scores: glibc hands a freed block of more than its
    mmap threshold back to the kernel, and a fresh block each time is faulted in anew (a global
    application at 1024, measured: 32k page faults, 83 ms instead of 16 ms to build its bias)."""
    return like.new_empty(max((b.stop - b.start) * (r.stop - r.start) for b, r in blocks) * heads * row_len * keys)


def _bias(rel_h: torch.Tensor, rel_w: torch.Tensor, block: Block, scratch: Optional[torch.Tensor] = None) -> torch.Tensor:
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
    blocks = _blocks(B, heads, q_h, q_w, keys, budget or default_block_elements(device_type, fused))
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
    blocks = _blocks(B, heads, q_h, q_w, keys, budget or default_block_elements(device_type, fused=False))
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


torch.fx.wrap("rel_pos_attention")


class RelPosAttention(Attention):
    """timm's ViT ``Attention`` (same parameters and names) plus ViTDet's decomposed relative
    positions (``add_decomposed_rel_pos``), added to the logits by ``rel_pos_attention``.

    A block may be applied both windowed and globally, and a relative offset means another
    thing in a 14x14 window than in a 64x64 grid, so the block holds one zero-initialised
    (height, width) table pair per extent it is applied at: ``window_rel_pos_{h,w}``
    (2 * window_size - 1 rows) and ``global_rel_pos_{h,w}`` (2 * grid - 1 rows for the
    model's ``img_size`` grid; interpolated for other input sizes, as ViTDet does).

    Args:
        window_size: the window of the block's windowed applications (0: it has none).
        global_grid: the patch grid of its global applications (None: it has none).
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, window_size: int = 0, global_grid: Optional[Tuple[int, int]] = None):
        super().__init__(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        if window_size:
            self.window_rel_pos_h = nn.Parameter(torch.zeros(2 * window_size - 1, self.head_dim))
            self.window_rel_pos_w = nn.Parameter(torch.zeros(2 * window_size - 1, self.head_dim))
        if global_grid is not None:
            self.global_rel_pos_h = nn.Parameter(torch.zeros(2 * global_grid[0] - 1, self.head_dim))
            self.global_rel_pos_w = nn.Parameter(torch.zeros(2 * global_grid[1] - 1, self.head_dim))

    @torch.no_grad()
    def reset_rel_pos(self):
        for name, p in self.named_parameters():
            if is_rel_pos(name):
                p.zero_()

    def rel_pos_tables(self, windowed: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        """The (height, width) tables of the windowed or of the global applications."""
        if windowed:
            return self.window_rel_pos_h, self.window_rel_pos_w
        return self.global_rel_pos_h, self.global_rel_pos_w

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], window_size: int = 0) -> torch.Tensor:
        """x: (B, h*w, D) tokens of the (h, w) patch grid, attended within windows of
        ``window_size`` or (0) over the whole grid."""
        return grid_attention(self, x, hw, window_size)


@torch.fx.wrap
@register_notrace_function
def window_qkv(qkv: torch.Tensor, bias: Optional[torch.Tensor], hw: Tuple[int, int], window_size: int,
               heads: int) -> torch.Tensor:
    """(B, h*w, 3 * heads * C) projections of the (h, w) patch grid -> (3, B * windows, heads,
    window_size**2, C): q, k and v of every window (windows in ViTDet's ``window_partition``
    order).

    ViTDet pads the block's input with zero tokens to whole windows and then projects them; a
    zero token's projection is the qkv bias. Here the projections of the real tokens are padded
    with the bias, which gives the same windows without projecting the padding (at 1024, 4096
    tokens instead of 70x70 = 4900). A leaf for FX: the padding is sized in Python."""
    B, _, width = qkv.shape
    h, w = hw
    rows, cols = -(-h // window_size), -(-w // window_size)
    grid = qkv.view(B, h, w, width)
    if (rows * window_size, cols * window_size) != (h, w):
        grid = F.pad(grid, (0, 0, 0, cols * window_size - w, 0, rows * window_size - h))
        if bias is not None:
            grid[:, h:] = bias
            grid[:, :h, w:] = bias
    windows = grid.view(B, rows, window_size, cols, window_size, 3, heads, width // (3 * heads))
    return windows.permute(5, 0, 1, 3, 6, 2, 4, 7).reshape(3, B * rows * cols, heads, window_size ** 2, -1)


@torch.fx.wrap
@register_notrace_function
def merge_windows(windows: torch.Tensor, hw: Tuple[int, int], window_size: int) -> torch.Tensor:
    """The inverse of ``window_qkv`` for attention's output: (B * windows, heads,
    window_size**2, C) -> (B, h*w, heads * C), the padding dropped (ViTDet's
    ``window_unpartition``). A leaf for FX, as ``window_qkv``."""
    _, heads, _, C = windows.shape
    h, w = hw
    rows, cols = -(-h // window_size), -(-w // window_size)
    grid = windows.view(-1, rows, cols, heads, window_size, window_size, C).permute(0, 1, 4, 2, 5, 3, 6)
    grid = grid.reshape(-1, rows * window_size, cols * window_size, heads * C)[:, :h, :w]
    return grid.reshape(-1, h * w, heads * C)


def grid_attention(attn: Attention, x: torch.Tensor, hw: Tuple[int, int], window_size: int = 0) -> torch.Tensor:
    """timm's ``Attention`` (same parameters, same result as its ``forward``) over the (B, h*w, D)
    tokens of an (h, w) patch grid: within ViTDet's windows of ``window_size`` (the grid padded
    to whole windows, see ``window_qkv``) or (0) over the whole grid; with decomposed relative
    positions when ``attn`` is a ``RelPosAttention``."""
    B, N, _ = x.shape
    qkv = attn.qkv(x)
    if window_size:
        q, k, v = window_qkv(qkv, attn.qkv.bias, hw, window_size, attn.num_heads).unbind(0)
        size = (window_size, window_size)
    else:
        q, k, v = qkv.reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        size = hw
    q, k = attn.q_norm(q), attn.k_norm(k)
    dropout_p = attn.attn_drop.p if attn.training else 0.0
    if isinstance(attn, RelPosAttention):
        x = rel_pos_attention(q, k, v, *attn.rel_pos_tables(windowed=bool(window_size)), size, dropout_p)
    else:
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    x = merge_windows(x, hw, window_size) if window_size else x.transpose(1, 2).reshape(B, N, attn.attn_dim)
    return attn.proj_drop(attn.proj(attn.norm(x)))


@torch.fx.wrap
@register_notrace_function
def check_patch_tokens(x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """``x`` unchanged if its tokens form the (h, w) patch grid, else a clear error. A leaf for
    FX (the test is Python control flow on the input's size), kept in the graph by returning ``x``."""
    if x.shape[1] != hw[0] * hw[1]:
        raise ValueError(f"{x.shape[1]} tokens do not form the {hw[0]}x{hw[1]} patch grid: windowed attention and "
                         f"relative positions take patch tokens only (no class token)")
    return x


def attend(attn: nn.Module, x: torch.Tensor, hw: Optional[Tuple[int, int]] = None,
           window_size: int = 0, attn_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One application of a block's attention to (B, N, D) tokens: global, or in windows of
    ``window_size`` over the (h, w) patch grid ``hw``; with the block's relative positions if
    it has them. Global attention without relative positions is exactly ``attn(x)``;
    ``attn_bias`` (global attention only: merged tokens' proportional attention) is added to
    its logits."""
    rel_pos = isinstance(attn, RelPosAttention)
    if not window_size and not rel_pos:
        return attn(x) if attn_bias is None else attn(x, attn_mask=attn_bias)
    if attn_bias is not None:
        raise ValueError("an attention bias (token merging) needs global attention without relative positions")
    if hw is None:
        raise ValueError("windowed attention and relative positions need the patch grid: call the unit as "
                         "unit(x, hw=(h, w)) (SRViT passes it)")
    return grid_attention(attn, check_patch_tokens(x, hw), hw, window_size)
