"""Layer-wise learning-rate decay and weight decay, one rule for every framework.

A parameter at layer ``i`` (``models/layer_ids.py``: layers are the *unique* blocks) gets the lr factor
``decay ** (num_layers + 1 - i)``, as in ViTDet / BEiT. The core's ``no_weight_decay()`` parameters take no
weight decay; whether norms and biases do is the convention a config names (``WEIGHT_DECAY_CONVENTIONS``,
docs/detectron2.md)."""
from typing import Sequence, Tuple

from .models.layer_ids import layer_depth, layer_id

__all__ = ["layer_id", "layer_depth", "lr_decay_factor", "WEIGHT_DECAY_CONVENTIONS", "weight_decay_exemptions"]


def lr_decay_factor(name: str, decay: float, unit_sizes: Sequence[int], prefix: str = "") -> float:
    """``decay ** (num_layers + 1 - layer_id)``; detectron2's ``lr_factor_func`` through ``functools.partial``."""
    return decay ** (sum(unit_sizes) + 1 - layer_id(name, unit_sizes, prefix))


# the kinds of parameter each convention exempts from weight decay, besides no_weight_decay()'s
WEIGHT_DECAY_CONVENTIONS = {
    "norms": ("norm",),  # detectron2's ViTDet, mmseg's ViT UPerNet
    "norms_and_biases": ("norm", "bias"),  # mmdet's ViTDet: every 1-D parameter and bias
}


def weight_decay_exemptions(convention: str) -> Tuple[str, ...]:
    """The kinds of parameter (``"norm"``, ``"bias"``) that ``convention`` exempts from weight decay.

    Raises:
        ValueError: an unknown convention.
    """
    if convention not in WEIGHT_DECAY_CONVENTIONS:
        raise ValueError(f"weight_decay_convention={convention!r} is not one of {sorted(WEIGHT_DECAY_CONVENTIONS)} "
                         f"(srvit_backbones/layer_decay.py): 'norms' as detectron2's ViTDet, 'norms_and_biases' as "
                         f"mmdet's ViTDet")
    return WEIGHT_DECAY_CONVENTIONS[convention]
