"""The one layer-id rule for layer-wise learning-rate decay with shared blocks.

A recursive block is applied at several depths, so "layer" is defined on the *unique*
blocks (SPEC section 6): the first ordinary block is layer 1, the following unique blocks
2, 3, ... in order, the last ordinary block is ``num_layers`` (the number of unique blocks).
A block's parameters, its relative-position tables (``...blocks.{k}.attn.*_rel_pos_{h,w}``)
included, take the block's id; a unit's router and step transforms take the id of the
unit's last block; the patch and position embeddings and the class/distillation tokens
take 0; everything else (final norm, necks, heads) takes ``num_layers + 1``. A parameter at
layer ``i`` gets the factor ``decay ** (num_layers + 1 - i)``, as in ViTDet / BEiT.

bViT (one shared block, unit sizes ``[1]``) is the degenerate case of the same rule, kept
on purpose: embeddings at id 0 (factor ``decay ** 2``), the shared block at id 1 (``decay``),
heads and necks at 2 (1.0). A block that serves every depth cannot take one depth's factor,
so it gets the single "block" id; the embeddings, which only the first step reads, are the
deepest-decayed, as in a ViT.

The Detectron2 (``lr_factor_func``) and MMDetection / MMSegmentation (optimizer constructor) paths
call ``layer_id`` / ``lr_decay_factor``; names are given relative to the core ``SRViT``
after removing ``prefix`` (e.g. ``backbone.net.srvit.``).

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
import re
from typing import Sequence, Tuple

_UNIT = re.compile(r"^units\.(\d+)\.(?:blocks\.(\d+)\.)?")
_EMBED = ("cls_token", "dist_token", "pos_embed", "patch_embed")


def layer_id(name: str, unit_sizes: Sequence[int], prefix: str = "") -> int:
    """Layer id of parameter ``name`` for a model whose units hold ``unit_sizes`` blocks
    (``[1, 4, 3, 2, 1, 1]`` for SR-ViT-S). Names without ``prefix`` are not backbone
    parameters and get ``num_layers + 1``."""
    num_layers = sum(unit_sizes)
    if prefix:
        if not name.startswith(prefix):
            return num_layers + 1
        name = name[len(prefix):]
    if name.startswith(_EMBED):
        return 0
    m = _UNIT.match(name)
    if m is None:
        return num_layers + 1
    unit = int(m.group(1))
    if unit >= len(unit_sizes):
        raise ValueError(f"parameter {name!r} names unit {unit}, but the model has {len(unit_sizes)} units")
    first = sum(unit_sizes[:unit])
    if m.group(2) is None:  # router / step transforms: the unit's last block
        return first + unit_sizes[unit]
    return first + int(m.group(2)) + 1


def lr_decay_factor(name: str, decay: float, unit_sizes: Sequence[int], prefix: str = "") -> float:
    """``decay ** (num_layers + 1 - layer_id)``; usable as detectron2's ``lr_factor_func``
    through ``functools.partial``."""
    return decay ** (sum(unit_sizes) + 1 - layer_id(name, unit_sizes, prefix))


def layer_depth(name: str, unit_sizes: Sequence[int], prefix: str = "") -> Tuple[int, int]:
    """mmpretrain's ``get_layer_depth`` protocol: (layer id, number of layer ids)."""
    return layer_id(name, unit_sizes, prefix), sum(unit_sizes) + 2


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
