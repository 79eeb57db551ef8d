"""The rules of the model's options, each stated once, so that an option is refused with the same
words wherever it is set (the schedule, the unit, the model, the checkpoint tools)."""
from typing import Optional, Sequence, Tuple

#: the one reason windows, relative positions and token merging exclude each other's tokens
NO_CLASS_TOKEN = "windowed attention and relative positions take patch tokens only (no class token)"


def is_int_in(value, low: int, high: Optional[int] = None) -> bool:
    """Whether ``value`` is an integer (a bool is not) with ``low <= value`` (``< high``)."""
    return not isinstance(value, bool) and isinstance(value, int) and low <= value and (high is None or value < high)


def check_num_steps(num_steps) -> int:
    """``num_steps`` (T) if it is an integer >= 1, else a ValueError."""
    if not is_int_in(num_steps, 1):
        raise ValueError(f"num_steps (T) must be an integer >= 1, got {num_steps!r}")
    return num_steps


def check_window_size(window_size) -> int:
    """``window_size`` if it is an integer >= 0 (0: global attention), else a ValueError."""
    if not is_int_in(window_size, 0):
        raise ValueError(f"window_size must be an integer >= 0 (0 = global attention everywhere, ViTDet uses 14), "
                         f"got {window_size!r}")
    return window_size


def check_merge_ratio(ratio) -> float:
    """Token merging's ratio as a float in [0, 0.5] (bipartite matching merges at most half), else a ValueError."""
    ratio = float(ratio)
    if not 0.0 <= ratio <= 0.5:
        raise ValueError(f"token_merge_ratio must be in [0, 0.5] (bipartite matching merges at most half the "
                         f"patch tokens; 0 = off), got {ratio}")
    return ratio


def check_merging_allowed(windowed: bool, rel_pos: bool, what: str = "token merging") -> None:
    """A ValueError where ``what`` meets windows or relative positions (merged tokens no longer form the grid)."""
    if windowed or rel_pos:
        raise ValueError(f"{what} needs global attention without relative positions: merged tokens no longer form "
                         f"the patch grid that windows and relative offsets are defined on; use window_size=0 and "
                         f"use_rel_pos=False, or token_merge_ratio=0")


def carries_class_token(window_size: int, use_rel_pos: bool) -> bool:
    """Whether a model carries the class token: not with windows or relative positions."""
    return not (window_size or use_rel_pos)


def split_pos_embed(num_tokens: int, prefix_counts: Sequence[int] = (1, 2, 0)) -> Tuple[int, int]:
    """(prefix tokens, grid side) of a position table of ``num_tokens`` entries: the first of
    ``prefix_counts`` (class token, + distillation token, none) that leaves a square grid; else a ValueError."""
    for prefix in prefix_counts:
        side = int(round(max(num_tokens - prefix, 0) ** 0.5))
        if side * side == num_tokens - prefix:
            return prefix, side
    raise ValueError(f"a pos_embed of {num_tokens} tokens is not a square grid plus class tokens")
