"""ViTDet's windows over the patch grid (detectron2's ``window_partition`` / ``window_unpartition``: the grid padded at
the bottom and right to whole windows), cut after the qkv projection so that the padding is not projected."""
from typing import Optional, Tuple

import torch
from timm.layers import register_notrace_function

from .constants import size_constants


def _window_order(grid: Tuple[int, int], window_size: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """The two index maps between the (h, w) grid and its windows (ViTDet's order): the token each window position
    reads (h * w for padding), and the window position each token lands at."""
    h, w = grid
    rows, cols = -(-h // window_size), -(-w // window_size)
    r = torch.arange(rows * window_size, device=device).view(rows, window_size, 1, 1)
    c = torch.arange(cols * window_size, device=device).view(1, 1, cols, window_size)
    token = torch.where((r < h) & (c < w), r * w + c, h * w)  # (rows, ws, cols, ws): padded-grid order
    token_of_position = token.permute(0, 2, 1, 3).reshape(-1)  # window-major, then row-major in a window
    tr, tc = torch.arange(h, device=device).view(h, 1), torch.arange(w, device=device).view(1, w)
    window = (tr // window_size) * cols + tc // window_size
    position_of_token = window * window_size ** 2 + (tr % window_size) * window_size + tc % window_size
    return token_of_position, position_of_token.reshape(-1)


def _batch_window_order(grid: Tuple[int, int], window_size: int, batch: int, device: torch.device):
    """``_window_order`` over a batch flattened into one token axis, the padding token last (batch * h * w)."""
    token_of_position, position_of_token = _window_order(grid, window_size, device)
    tokens = grid[0] * grid[1]
    images = torch.arange(batch, device=device)[:, None]
    reads = torch.where(token_of_position < tokens, token_of_position + images * tokens, batch * tokens)
    return reads.reshape(-1), position_of_token


#: ``_batch_window_order`` made once per geometry, batch and device
window_order = size_constants(_batch_window_order)


@register_notrace_function
def window_qkv(qkv: torch.Tensor, bias: Optional[torch.Tensor], grid: Tuple[int, int], window_size: int,
               heads: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v, each (B * windows, heads, window_size**2, C), of every window of ViTDet's padded grid, from the
    (B, h*w, 3 * heads * C) projections of the real tokens: the padding's projection is the qkv ``bias`` (None: zeros),
    one row after the batch's tokens, and every window position reads its row by one ``index_select``. A leaf for FX."""
    B, N, width = qkv.shape
    h, w = grid
    windows = -(-h // window_size) * -(-w // window_size)
    reads, _ = window_order(tuple(grid), window_size, B, qkv.device)
    rows = qkv.reshape(B * N, width)
    if windows * window_size ** 2 != N:
        padding = qkv.new_zeros(1, width) if bias is None else bias.to(qkv.dtype).view(1, width)
        rows = torch.cat([rows, padding])
    gathered = rows.index_select(0, reads).view(B * windows, window_size ** 2, 3, heads, -1)
    q, k, v = (t.transpose(1, 2) for t in gathered.unbind(2))
    return q, k, v


@register_notrace_function
def merge_windows(windows: torch.Tensor, grid: Tuple[int, int], window_size: int) -> torch.Tensor:
    """The inverse of ``window_qkv`` for attention's (B * windows, heads, window_size**2, C) output (ViTDet's
    ``window_unpartition``): (B, h*w, heads * C), the padding dropped, by one ``index_select``. A leaf for FX."""
    _, heads, tokens, C = windows.shape
    h, w = grid
    per_image = -(-h // window_size) * -(-w // window_size) * tokens
    _, position_of_token = window_order(tuple(grid), window_size, 1, windows.device)
    flat = windows.transpose(1, 2).reshape(-1, per_image, heads * C)
    return flat.index_select(1, position_of_token)
