"""Layer-wise learning-rate decay and weight decay, one rule for every framework.

Learning rate: a parameter at layer ``i`` of the core's layer-id rule (``models/layer_ids.py``:
layers are the *unique* blocks, so a shared block has one id) gets the factor
``decay ** (num_layers + 1 - i)``, as in ViTDet / BEiT. The Detectron2 (``lr_factor_func``) and
MMDetection / MMSegmentation (optimizer constructor) paths call ``layer_id`` /
``lr_decay_factor``; names are given relative to the core ``SRViT`` after removing ``prefix``
(e.g. ``backbone.net.srvit.``).

Weight decay, the same in every framework. The core's ``no_weight_decay()`` parameters take
none under every convention: the position table, the class / distillation tokens and the
relative-position tables (positions, as in timm's ViT and detectron2's MViTv2 configs; ViTDet
decays its rel-pos tables, ours start at zero from an ImageNet checkpoint and stay positions).
Every other backbone parameter is a LayerNorm's or a Linear / Conv2d layer's weight or bias
(the routers and step transforms are Linear layers like the blocks' and follow the same rule):
weights take weight decay; whether norms and the other biases do is the convention of the
recipe a config reproduces, which every config names (``WEIGHT_DECAY_CONVENTIONS``):
``detectron2_configs/`` detectron2 ViTDet's ``'norms'``, ``mmdet_configs/`` mmdet ViTDet's
``'norms_and_biases'``, ``mmseg_configs/`` mmseg ViT UPerNet's ``'norms'``. A convention applies to
the whole model, heads included, as in the recipe it comes from; each adapter sets it as its
framework's own options (detectron2's ``weight_decay_norm`` / ``weight_decay_bias``, mmengine's
``norm_decay_mult`` / ``bias_decay_mult``).
"""
from typing import Sequence, Tuple

from .models.layer_ids import layer_depth, layer_id

__all__ = ["layer_id", "layer_depth", "lr_decay_factor", "WEIGHT_DECAY_CONVENTIONS", "weight_decay_exemptions"]


def lr_decay_factor(name: str, decay: float, unit_sizes: Sequence[int], prefix: str = "") -> float:
    """``decay ** (num_layers + 1 - layer_id)``; usable as detectron2's ``lr_factor_func``
    through ``functools.partial``."""
    return decay ** (sum(unit_sizes) + 1 - layer_id(name, unit_sizes, prefix))


# The kinds of parameter each convention exempts from weight decay, besides the core's
# no_weight_decay() names: "norm" (a norm layer's weight and bias), "bias" (every bias).
WEIGHT_DECAY_CONVENTIONS = {
    # detectron2's ViTDet (get_default_optimizer_params(weight_decay_norm=0) and a pos_embed
    # override) and mmseg's ViT UPerNet (custom_keys norm / pos_embed / cls_token: decay_mult=0)
    "norms": ("norm",),
    # mmdet's ViTDet constructor (and BEiT's): every 1-D parameter and every bias, which for
    # SR-ViT are the norms and the biases
    "norms_and_biases": ("norm", "bias"),
}


def weight_decay_exemptions(convention: str) -> Tuple[str, ...]:
    """The kinds of parameter (``"norm"``, ``"bias"``) that ``convention`` exempts from weight decay."""
    if convention not in WEIGHT_DECAY_CONVENTIONS:
        raise ValueError(f"weight_decay_convention={convention!r} is not one of {sorted(WEIGHT_DECAY_CONVENTIONS)} "
                         f"(srvit_backbones/layer_decay.py): 'norms' as detectron2's ViTDet, 'norms_and_biases' as "
                         f"mmdet's ViTDet")
    return WEIGHT_DECAY_CONVENTIONS[convention]
