"""ViTDet's windows over the patch grid (detectron2's ``window_partition`` /
``window_unpartition``: the grid padded at the bottom and right to whole windows),
partitioned after the qkv projection so that the padding is not projected. A shared block runs
at several depths, so whether an attention is windowed is a property of the *application*
(``schedule.Application.window_size``), not of the block; ``attention.grid_attention`` uses these.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function


@register_notrace_function
def window_qkv(qkv: torch.Tensor, bias: Optional[torch.Tensor], grid: Tuple[int, int], window_size: int,
               heads: int) -> torch.Tensor:
    """(B, h*w, 3 * heads * C) projections of the (h, w) patch grid -> (3, B * windows, heads,
    window_size**2, C): q, k and v of every window (windows in ViTDet's ``window_partition``
    order).

    ViTDet pads the block's input with zero tokens to whole windows and then projects them; a
    zero token's projection is the qkv bias. Here the projections of the real tokens are padded
    with the bias, which gives the same windows without projecting the padding (at 1024, 4096
    tokens instead of 70x70 = 4900). A leaf for FX (the padding is sized in Python): see ``attention``."""
    B, _, width = qkv.shape
    h, w = grid
    rows, cols = -(-h // window_size), -(-w // window_size)
    padded = qkv.view(B, h, w, width)
    if (rows * window_size, cols * window_size) != (h, w):
        padded = F.pad(padded, (0, 0, 0, cols * window_size - w, 0, rows * window_size - h))
        if bias is not None:
            padded[:, h:] = bias
            padded[:, :h, w:] = bias
    windows = padded.view(B, rows, window_size, cols, window_size, 3, heads, width // (3 * heads))
    return windows.permute(5, 0, 1, 3, 6, 2, 4, 7).reshape(3, B * rows * cols, heads, window_size ** 2, -1)


@register_notrace_function
def merge_windows(windows: torch.Tensor, grid: Tuple[int, int], window_size: int) -> torch.Tensor:
    """The inverse of ``window_qkv`` for attention's output: (B * windows, heads,
    window_size**2, C) -> (B, h*w, heads * C), the padding dropped (ViTDet's
    ``window_unpartition``). A leaf for FX, as ``window_qkv``."""
    _, heads, _, C = windows.shape
    h, w = grid
    rows, cols = -(-h // window_size), -(-w // window_size)
    padded = windows.view(-1, rows, cols, heads, window_size, window_size, C).permute(0, 1, 4, 2, 5, 3, 6)
    padded = padded.reshape(-1, rows * window_size, cols * window_size, heads * C)[:, :h, :w]
    return padded.reshape(-1, h * w, heads * C)
