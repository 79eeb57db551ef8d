"""The one layer-id rule for layer-wise learning-rate decay with shared blocks.

A recursive block is applied at several depths, so "layer" is defined on the *unique*
blocks (SPEC section 6): the first ordinary block is layer 1, the following unique blocks
2, 3, ... in order, the last ordinary block is ``num_layers`` (the number of unique blocks).
A block's parameters, its relative-position tables (``...blocks.{k}.attn.*_rel_pos_{h,w}``)
included, take the block's id; a unit's router and step transforms take the id of the
unit's last block; the patch and position embeddings and the class/distillation tokens
take 0; everything else (final norm, necks, heads) takes ``num_layers + 1``. A parameter at
layer ``i`` gets the factor ``decay ** (num_layers + 1 - i)``, as in ViTDet / BEiT
(``srvit_backbones.layer_decay``, which the framework adapters call).

bViT (one shared block, unit sizes ``[1]``) is the degenerate case of the same rule, kept
on purpose: embeddings at id 0 (factor ``decay ** 2``), the shared block at id 1 (``decay``),
heads and necks at 2 (1.0). A block that serves every depth cannot take one depth's factor,
so it gets the single "block" id; the embeddings, which only the first step reads, are the
deepest-decayed, as in a ViT.

Part of the core because the model answers for it (timm's ``group_matcher``, mmpretrain's
``get_layer_depth``); names are given relative to the core ``SRViT`` after removing ``prefix``
(e.g. ``backbone.net.srvit.``).
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


def layer_depth(name: str, unit_sizes: Sequence[int], prefix: str = "") -> Tuple[int, int]:
    """mmpretrain's ``get_layer_depth`` protocol: (layer id, number of layer ids)."""
    return layer_id(name, unit_sizes, prefix), sum(unit_sizes) + 2
