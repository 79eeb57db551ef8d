"""SR-ViT as a detectron2 ``Backbone``: a thin wrapper around the core model.

Like ViTDet's ``ViT`` it knows nothing about the detector: it outputs stride-16 maps
(``last_feat`` and ``unit{i}`` for the recursive units) and is wrapped by detectron2's own
``SimpleFeaturePyramid`` in the configs.
"""
from functools import partial
from typing import Optional, Sequence

import torch.nn as nn
from detectron2.layers import ShapeSpec
from detectron2.modeling import Backbone

from ..layer_decay import lr_decay_factor
from ..models import create_srvit, variant_args

#: parameter-name prefix of the core model inside the ViTDet-style detector
#: (``model.backbone`` = SimpleFeaturePyramid, ``.net`` = this backbone, ``.srvit`` = core)
SRVIT_PREFIX = "backbone.net.srvit."


class SRViTBackbone(Backbone):
    """Args:
        variant: a named SR-ViT variant (``srvit_s_t3``, ``srvit_deit_s``, ...).
        img_size: size of the position-embedding table (1024 for LSJ: a full 64x64 grid).
        out_features: among ``last_feat`` and ``unit{i}`` (i over ``model.units``).
        drop_path_rate: stochastic depth over the effective depth.
        use_act_checkpoint: checkpoint every block application (non-reentrant, DDP-safe).
        **overrides: any other core argument (``num_steps``, ``layout``, ``aggregation``...).
    """

    def __init__(self, variant: str = "srvit_s_t3", img_size: int = 1024,
                 out_features: Sequence[str] = ("last_feat",), drop_path_rate: float = 0.1,
                 use_act_checkpoint: bool = False, **overrides):
        super().__init__()
        self.srvit = create_srvit(variant, img_size=img_size, num_classes=0, global_pool="",
                                  drop_path_rate=drop_path_rate, **overrides)
        # ViTDet's ViT has no final norm: the SFP normalises; an unused norm would also
        # leave parameters without gradients under DDP.
        self.srvit.norm = nn.Identity()
        self.srvit.set_grad_checkpointing(use_act_checkpoint)
        units = len(self.srvit.units)
        known = ["last_feat"] + [f"unit{i}" for i in range(units)]
        unknown = [f for f in out_features if f not in known]
        if not out_features or unknown:
            raise ValueError(f"out_features {list(out_features)}: unknown {unknown}; choose from {known} "
                             f"(recursive units: {[f'unit{i}' for i in self.srvit.recursive_unit_indices]})")
        self._out_features = list(out_features)
        self._unit_indices = [int(f[4:]) for f in out_features if f.startswith("unit")]
        stride = self.srvit.patch_size
        self._out_feature_channels = {f: self.srvit.embed_dim for f in out_features}
        self._out_feature_strides = {f: stride for f in out_features}

    @property
    def size_divisibility(self) -> int:
        return self.srvit.patch_size

    def forward(self, x):
        feats = self.srvit.forward_feature_maps(x, indices=self._unit_indices)
        return {f: feats[f] for f in self._out_features}

    def output_shape(self):
        return {f: ShapeSpec(channels=self._out_feature_channels[f], stride=self._out_feature_strides[f])
                for f in self._out_features}


def srvit_lr_factor_func(variant: str, decay: float = 0.7, prefix: str = SRVIT_PREFIX,
                         layout: Optional[Sequence[int]] = None):
    """detectron2 ``lr_factor_func`` for a variant, by the shared-block rule."""
    layout = tuple(layout) if layout is not None else variant_args(variant)["layout"]
    return partial(lr_decay_factor, decay=decay, unit_sizes=[1, *layout, 1], prefix=prefix)
