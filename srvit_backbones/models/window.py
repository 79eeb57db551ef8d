"""ViTDet-style window attention and decomposed relative positions for SR-ViT's blocks.

A shared block runs at several depths, so whether an attention is windowed is a property
of the *application* (``SoftMoRUnit.window_sizes``), not of the block. The window partition,
its padding to multiples of the window size, and the decomposed relative-position bias are
timm's copies of detectron2's ViTDet helpers (``timm.models.vision_transformer_sam``), reused
here by import. Windows and relative positions work on patch tokens only: a model that uses
them carries no class token.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention, register_notrace_function
from timm.models.vision_transformer_sam import get_rel_pos, window_partition, window_unpartition

#: query tokens per attention call with relative positions: the bias is a (B, heads, queries,
#: keys) tensor, 400 MB for all 64x64 queries of a 1024 input at 6 heads; chunks keep it at 100 MB
REL_POS_QUERY_CHUNK = 1024

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


@register_notrace_function
def rel_pos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_pos_h: torch.Tensor,
                      rel_pos_w: torch.Tensor, size: Tuple[int, int], dropout_p: float = 0.0,
                      chunk: int = REL_POS_QUERY_CHUNK) -> torch.Tensor:
    """Attention over (B, heads, h*w, C) tokens of a (h, w) grid with ViTDet's decomposed
    relative positions (MViTv2's ``add_decomposed_rel_pos``: the bias of query i and key j is
    q_i . R_h[row_i - row_j] + q_i . R_w[col_i - col_j]). timm's
    ``get_decomposed_rel_pos_bias`` builds the whole (queries, keys) bias at once; here the
    per-axis terms are computed once and the bias is expanded for ``chunk`` queries (whole grid
    rows) at a time, so a global application at 1024 does not hold a 4096x4096 bias per head.
    A leaf for FX: the chunks are a Python loop over the grid's size."""
    B, heads, N, C = q.shape
    q_h, q_w = size
    r_q = q.reshape(B, heads, q_h, q_w, C)
    rel_h = torch.einsum("bnhwc,hkc->bnhwk", r_q, get_rel_pos(q_h, q_h, rel_pos_h).to(q.dtype))
    rel_w = torch.einsum("bnhwc,wkc->bnhwk", r_q, get_rel_pos(q_w, q_w, rel_pos_w).to(q.dtype))
    rows = max(1, chunk // q_w)
    out = []
    for r0 in range(0, q_h, rows):
        r1 = min(r0 + rows, q_h)
        bias = (rel_h[:, :, r0:r1, :, :, None] + rel_w[:, :, r0:r1, :, None, :]).reshape(B, heads, -1, N)
        out.append(F.scaled_dot_product_attention(q[:, :, r0 * q_w:r1 * q_w], k, v, attn_mask=bias,
                                                  dropout_p=dropout_p))
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


torch.fx.wrap("rel_pos_attention")


class RelPosAttention(Attention):
    """timm's ViT ``Attention`` (same parameters and names) plus ViTDet's decomposed relative
    positions (``add_decomposed_rel_pos``), added to the fused attention as ``attn_mask``.

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

    def forward(self, x: torch.Tensor, size: Tuple[int, int], windowed: bool) -> torch.Tensor:
        """x: (B, h*w, D) tokens of a (h, w) window (``windowed``) or of the whole grid."""
        if windowed:
            rel_h, rel_w = self.window_rel_pos_h, self.window_rel_pos_w
        else:
            rel_h, rel_w = self.global_rel_pos_h, self.global_rel_pos_w
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        x = rel_pos_attention(q, k, v, rel_h, rel_w, size, self.attn_drop.p if self.training else 0.0)
        x = self.norm(x.transpose(1, 2).reshape(B, N, self.attn_dim))
        return self.proj_drop(self.proj(x))


def to_windows(x: torch.Tensor, hw: Tuple[int, int], window_size: int) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """(B, h*w, D) -> (B * windows, window_size**2, D), the grid zero-padded at the bottom and
    right to multiples of ``window_size`` (ViTDet's ``window_partition``); and the padded grid."""
    windows, pad_hw = window_partition(x.view(x.shape[0], hw[0], hw[1], x.shape[-1]), window_size)
    return windows.view(-1, window_size * window_size, x.shape[-1]), pad_hw


def from_windows(windows: torch.Tensor, hw: Tuple[int, int], pad_hw: Tuple[int, int], window_size: int) -> torch.Tensor:
    """The inverse of ``to_windows``: padding removed, (B, h*w, D)."""
    x = window_unpartition(windows.view(-1, window_size, window_size, windows.shape[-1]), window_size, hw, pad_hw)
    return x.view(x.shape[0], hw[0] * hw[1], x.shape[-1])


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
    x = check_patch_tokens(x, hw)
    if not window_size:
        return attn(x, hw, windowed=False)
    windows, pad_hw = to_windows(x, hw, window_size)
    size = (window_size, window_size)
    windows = attn(windows, size, windowed=True) if rel_pos else attn(windows)
    return from_windows(windows, hw, pad_hw, window_size)
