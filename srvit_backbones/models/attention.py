"""One application of a block's attention over the patch grid: timm's ``Attention`` in ViTDet's windows or globally,
with decomposed relative positions when the block is a ``RelPosAttention`` (patch tokens only)."""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention, register_notrace_function

from .rel_pos import check_kernel, is_rel_pos, rel_pos_attention
from .rules import NO_CLASS_TOKEN
from .window import merge_windows, window_qkv

# leaves for FX where they are called (their loops and padding are sized in Python)
torch.fx.wrap("rel_pos_attention")
torch.fx.wrap("window_qkv")
torch.fx.wrap("merge_windows")


class RelPosAttention(Attention):
    """timm's ViT ``Attention`` (same parameters and names) plus ViTDet's decomposed relative positions.

    An offset means another thing in a window than in the whole grid, so the block holds one zero-initialised (height,
    width) table pair per extent it is applied at: ``window_rel_pos_{h,w}`` (2 * window_size - 1 rows) and
    ``global_rel_pos_{h,w}`` (2 * grid - 1 rows for ``img_size``'s grid, interpolated for other sizes, as ViTDet).
    ``Block(attn_layer=RelPosAttention)`` builds it as ``Attention``; ``add_rel_pos_tables`` then adds the tables.

    Args:
        dim, num_heads, kwargs: timm's ``Attention`` arguments.
        window_size: the window of the block's windowed applications (0: it has none).
        global_grid: the patch grid of its global applications (None: it has none).
        rel_pos_kernel: the ``rel_pos.KERNELS`` kernel every call runs (None: ``choose_kernel``'s).

    Raises:
        ValueError: ``rel_pos_kernel`` is not one of ``rel_pos.KERNELS``.
    """

    def __init__(self, dim: int, num_heads: int = 8, window_size: int = 0,
                 global_grid: Optional[Tuple[int, int]] = None, rel_pos_kernel: Optional[str] = None, **kwargs):
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.rel_pos_kernel = check_kernel(rel_pos_kernel)
        self.add_rel_pos_tables(window_size, global_grid)

    def add_rel_pos_tables(self, window_size: int = 0, global_grid: Optional[Tuple[int, int]] = None):
        """Zero tables for windowed applications of ``window_size`` and global ones over ``global_grid``."""
        like = dict(device=self.qkv.weight.device, dtype=self.qkv.weight.dtype)
        if window_size:
            self.window_rel_pos_h = nn.Parameter(torch.zeros(2 * window_size - 1, self.head_dim, **like))
            self.window_rel_pos_w = nn.Parameter(torch.zeros(2 * window_size - 1, self.head_dim, **like))
        if global_grid is not None:
            self.global_rel_pos_h = nn.Parameter(torch.zeros(2 * global_grid[0] - 1, self.head_dim, **like))
            self.global_rel_pos_w = nn.Parameter(torch.zeros(2 * global_grid[1] - 1, self.head_dim, **like))

    @torch.no_grad()
    def reset_rel_pos(self):
        """Zero every relative-position table (their initial value)."""
        for name, p in self.named_parameters():
            if is_rel_pos(name):
                p.zero_()

    def rel_pos_tables(self, windowed: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        """The (height, width) tables of the windowed or of the global applications."""
        if windowed:
            return self.window_rel_pos_h, self.window_rel_pos_w
        return self.global_rel_pos_h, self.global_rel_pos_w

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                grid: Optional[Tuple[int, int]] = None, window_size: Optional[int] = None) -> torch.Tensor:
        """timm ``Attention``'s call on (B, h*w, D) patch tokens, so that ``block(x)`` works on every block: ``grid``
        defaults to square, ``window_size`` to global where the block has global tables, else its windows; a mask or
        ``is_causal`` is refused."""
        if attn_mask is not None or is_causal:
            raise ValueError("relative-position attention takes no attention mask and is not causal (token "
                             "merging's bias needs global attention without relative positions)")
        if grid is None:
            side = math.isqrt(x.shape[1])
            if side * side != x.shape[1]:
                raise ValueError(f"{x.shape[1]} tokens do not form a square patch grid: pass grid=(h, w)")
            grid = (side, side)
        if window_size is None:
            window_size = 0 if hasattr(self, "global_rel_pos_h") else self.window_rel_pos_h.shape[0] // 2 + 1
        return grid_attention(self, x, grid, window_size)


@torch.fx.wrap
@register_notrace_function
def check_patch_tokens(x: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
    """``x`` unchanged if its tokens form the (h, w) patch grid, else a ValueError. A leaf for FX."""
    if x.shape[1] != grid[0] * grid[1]:
        raise ValueError(f"{x.shape[1]} tokens do not form the {grid[0]}x{grid[1]} patch grid: {NO_CLASS_TOKEN}")
    return x


def grid_attention(attn: Attention, x: torch.Tensor, grid: Optional[Tuple[int, int]],
                   window_size: int = 0) -> torch.Tensor:
    """The grid path of a block's attention: timm's ``Attention`` (norms included) within ViTDet's windows of
    ``window_size`` (grid padded to whole windows; 0: whole grid) over the (h, w) patch ``grid``, with decomposed
    relative positions when ``attn`` is a ``RelPosAttention``; a ValueError without a grid or for other tokens."""
    if grid is None:
        raise ValueError("windowed attention and relative positions need the patch grid: call the unit as "
                         "unit(x, grid=(h, w)) (SRViT passes it)")
    B, N, _ = check_patch_tokens(x, grid).shape
    qkv = attn.qkv(x)
    if window_size:
        q, k, v = window_qkv(qkv, attn.qkv.bias, grid, window_size, attn.num_heads)
        size = (window_size, window_size)
    else:
        q, k, v = qkv.reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        size = grid
    q, k = attn.q_norm(q), attn.k_norm(k)
    dropout_p = attn.attn_drop.p if attn.training else 0.0
    if isinstance(attn, RelPosAttention):
        x = rel_pos_attention(q, k, v, *attn.rel_pos_tables(windowed=bool(window_size)), size, dropout_p,
                              kernel=attn.rel_pos_kernel)
    else:
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    x = merge_windows(x, grid, window_size) if window_size else x.transpose(1, 2).reshape(B, N, attn.attn_dim)
    x = attn.norm(x)
    return attn.proj_drop(attn.proj(x))
