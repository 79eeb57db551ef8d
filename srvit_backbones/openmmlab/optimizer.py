"""Layer-wise lr decay for SR-ViT in MMSegmentation and MMDetection, by the package's one rule.

mmseg's and mmdet's own ``LearningRateDecayOptimizerConstructor`` refuse backbones other than
ConvNeXt/BEiT/MAE; this constructor asks the backbone ``get_layer_depth(name)`` instead
(mmpretrain's protocol), so Detectron2, MMDetection and MMSegmentation give every parameter
the same factor. ``srvit_backbones.mmseg`` and ``srvit_backbones.mmdet`` register it:

    optim_wrapper = dict(type='OptimWrapper', constructor='SRViTLayerDecayOptimizerConstructor',
                         optimizer=dict(type='AdamW', lr=6e-5, weight_decay=0.01),
                         paramwise_cfg=dict(layer_decay_rate=0.9))
"""
from typing import List

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.optim import DefaultOptimWrapperConstructor


class SRViTLayerDecayOptimizerConstructor(DefaultOptimWrapperConstructor):
    """``paramwise_cfg``: ``layer_decay_rate`` (1.0 = none) and ``no_decay_norm_bias``
    (default True: biases, norms and the core's ``no_weight_decay()`` embeddings/tokens get
    no weight decay)."""

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        decay_rate = float(self.paramwise_cfg.get("layer_decay_rate", 1.0))
        no_decay_1d = bool(self.paramwise_cfg.get("no_decay_norm_bias", True))
        backbone = getattr(module, "backbone", None)
        if backbone is None or not hasattr(backbone, "get_layer_depth"):
            raise TypeError("SRViTLayerDecayOptimizerConstructor needs model.backbone with get_layer_depth() "
                            f"(an SRViT backbone); got {type(backbone).__name__}")
        no_decay_names = {"backbone." + name for name in backbone.no_weight_decay()}
        groups = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            no_decay = no_decay_1d and (param.ndim == 1 or name.endswith(".bias") or name in no_decay_names)
            # parameters outside the backbone (neck, heads) get the last id: factor 1
            layer_id, num_ids = backbone.get_layer_depth(name, prefix="backbone.")
            scale = decay_rate ** (num_ids - 1 - layer_id)
            key = (layer_id, no_decay)
            if key not in groups:
                groups[key] = dict(params=[], param_names=[], lr=self.base_lr * scale, lr_scale=scale,
                                   weight_decay=0.0 if no_decay else self.base_wd, layer_id=layer_id)
            groups[key]["params"].append(param)
            groups[key]["param_names"].append(name)
        params.extend(groups[k] for k in sorted(groups))
        MMLogger.get_current_instance().info(
            "SR-ViT layer decay %.3f: %d groups over %d layer ids", decay_rate, len(groups),
            len({k[0] for k in groups}))
