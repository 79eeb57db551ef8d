"""The one layer-id rule for layer-wise learning-rate decay with shared blocks: "layer" counts the
*unique* blocks (a recursive block runs at several depths). Embeddings and tokens take 0, the
unique blocks 1..num_layers in order (their relative-position tables included), a unit's router
and step transforms its last block's id, everything else num_layers + 1; a parameter at layer i
gets ``decay ** (num_layers + 1 - i)`` (ViTDet / BEiT). bViT is the same rule with one block
(docs/models.md). The model answers for it (timm's ``group_matcher``, mmpretrain's ``get_layer_depth``).
"""
import re
from typing import Sequence, Tuple

_UNIT = re.compile(r"^units\.(\d+)\.(?:blocks\.(\d+)\.)?")
_EMBED = ("cls_token", "dist_token", "pos_embed", "patch_embed")


def layer_id(name: str, unit_sizes: Sequence[int], prefix: str = "") -> int:
    """The layer id, 0 .. num_layers + 1, of parameter ``name``.

    Args:
        unit_sizes: the blocks of every unit (``[1, 4, 3, 2, 1, 1]`` for SR-ViT-S).
        prefix: the core ``SRViT``'s prefix in ``name`` (``backbone.net.srvit.``); names without it are not backbone's.

    Raises:
        ValueError: a name of a unit the model does not have.
    """
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
