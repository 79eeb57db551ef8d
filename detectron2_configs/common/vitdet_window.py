"""ViTDet's attention settings (detectron2's ``projects/ViTDet``), applied to a global config's
``model.backbone.net`` by the ``*_win`` configs: 14x14 windows, decomposed relative positions.

The block applications that stay global are the core's default (``global_attn_indexes=None``:
the first application of every unit feeding the dense heads and the last one; ViTDet's 2, 5,
8, 11 for DeiT-S). The windowed backbone carries no class token: a pretraining checkpoint's
class token and its position entry are dropped when it loads, the relative-position tables
start at zero (as ViTDet's start from ImageNet weights).
"""

vitdet_window = dict(window_size=14, use_rel_pos=True, global_attn_indexes=None)
