"""Layer-wise lr decay for SR-ViT in MMSegmentation and MMDetection, by the package's one rule (mmseg's and
mmdet's own constructors refuse backbones other than ConvNeXt/BEiT/MAE)."""
from typing import List, Optional

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.optim import DefaultOptimWrapperConstructor

from ..layer_decay import weight_decay_exemptions

MMENGINE_KEYS = ("custom_keys", "bias_lr_mult", "bias_decay_mult", "norm_decay_mult", "dwconv_decay_mult",
                 "flat_decay_mult", "dcn_offset_lr_mult", "bypass_duplicate")
OWN_KEYS = ("layer_decay_rate", "weight_decay_convention")
VITDET_KEYS = ("decay_rate", "decay_type", "num_layers")
DEFAULT_LAYER_DECAY_RATE = 0.7  # ViTDet's, and detectron2's srvit_optimizer_params'
DEFAULT_CONVENTION = "norms_and_biases"  # mmdet's ViTDet constructor's: every 1-D parameter and bias
# a convention's exempt kinds (layer_decay.WEIGHT_DECAY_CONVENTIONS) in mmengine's terms
_DECAY_MULT_OF_KIND = {"norm": "norm_decay_mult", "bias": "bias_decay_mult"}


class SRViTLayerDecayOptimizerConstructor(DefaultOptimWrapperConstructor):
    """mmengine's ``DefaultOptimWrapperConstructor`` whose lr is then multiplied by the layer-decay factor
    the backbone's ``get_layer_depth`` gives (mmpretrain's protocol).

    ``paramwise_cfg`` (optional), besides mmengine's keys:
        layer_decay_rate: factor per layer id (default 0.7; 1.0 = none); mmdet ViTDet's ``decay_rate``,
            ``decay_type='layer_wise'`` and ``num_layers`` (the backbone's unique blocks) are accepted.
        weight_decay_convention: ``layer_decay.WEIGHT_DECAY_CONVENTIONS`` (default ``'norms_and_biases'``),
            set as ``norm_decay_mult`` / ``bias_decay_mult`` = 0; ``no_weight_decay()`` parameters take
            none either, unless a ``custom_keys`` entry names them.
    Raises:
        ValueError: any other key, contradicting keys, or an optimizer without ``weight_decay``.
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None):
        cfg = dict(paramwise_cfg or {})
        unknown = [k for k in cfg if k not in MMENGINE_KEYS + OWN_KEYS + VITDET_KEYS]
        if unknown:
            raise ValueError(f"paramwise_cfg keys {unknown} are not read by SRViTLayerDecayOptimizerConstructor: it "
                             f"reads {list(OWN_KEYS)}, mmdet ViTDet's {list(VITDET_KEYS)} and mmengine's "
                             f"{list(MMENGINE_KEYS)}")
        if "decay_rate" in cfg:
            if "layer_decay_rate" in cfg:
                raise ValueError("paramwise_cfg gives both layer_decay_rate and decay_rate (mmdet ViTDet's name for "
                                 "it): keep one")
            cfg["layer_decay_rate"] = cfg.pop("decay_rate")
        decay_type = cfg.pop("decay_type", "layer_wise")
        if decay_type != "layer_wise":
            raise ValueError(f"paramwise_cfg decay_type={decay_type!r}: SR-ViT's layer ids are per unique block, "
                             f"mmdet's 'layer_wise'; there is no stage-wise rule: remove decay_type")
        self.num_layers = cfg.pop("num_layers", None)
        self.layer_decay_rate = float(cfg.setdefault("layer_decay_rate", DEFAULT_LAYER_DECAY_RATE))
        convention = cfg.setdefault("weight_decay_convention", DEFAULT_CONVENTION)
        if optim_wrapper_cfg.get("optimizer", {}).get("weight_decay") is None:
            # mmengine's decay rules would be skipped and the optimizer's default decay given to all
            raise ValueError("SRViTLayerDecayOptimizerConstructor needs optim_wrapper.optimizer.weight_decay (the "
                             "no-decay set is relative to it): set it, 0.0 for none")
        for kind in weight_decay_exemptions(convention):
            key = _DECAY_MULT_OF_KIND[kind]
            if cfg.setdefault(key, 0.0) != 0.0:
                raise ValueError(f"paramwise_cfg {key}={cfg[key]} contradicts weight_decay_convention={convention!r}, "
                                 f"which gives {kind}s no weight decay: remove {key} or choose another convention")
        # our keys stay in paramwise_cfg: mmengine calls add_params only for a non-empty one
        super().__init__(optim_wrapper_cfg, cfg)

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = "", **kwargs) -> None:
        if prefix:  # mmengine's recursion into a child module: its own rules
            return super().add_params(params, module, prefix=prefix, **kwargs)
        backbone = getattr(module, "backbone", None)
        if backbone is None or not hasattr(backbone, "get_layer_depth"):
            raise TypeError("SRViTLayerDecayOptimizerConstructor needs model.backbone with get_layer_depth() "
                            f"(an SRViT backbone); got {type(backbone).__name__}")
        num_blocks = sum(backbone.layer_decay_unit_sizes)
        if self.num_layers is not None and self.num_layers != num_blocks:
            raise ValueError(f"paramwise_cfg num_layers={self.num_layers}, but SR-ViT's layer ids count the "
                             f"backbone's unique blocks: {num_blocks} here; remove num_layers")
        if self.base_lr is None and self.layer_decay_rate != 1.0:
            raise ValueError("layer decay needs the optimizer's lr: set optim_wrapper.optimizer.lr")
        groups: List[dict] = []
        super().add_params(groups, module, **kwargs)  # one group per parameter, by mmengine's rules
        names = {id(p): n for n, p in module.named_parameters()}
        no_decay = {"backbone." + n for n in backbone.no_weight_decay()}
        custom_keys = self.paramwise_cfg.get("custom_keys", {})
        merged = {}
        for group in groups:
            name = names[id(group["params"][0])]
            # parameters outside the backbone (neck, heads) get the last id: factor 1
            layer_id, num_ids = backbone.get_layer_depth(name, prefix="backbone.")
            scale = self.layer_decay_rate ** (num_ids - 1 - layer_id)
            if scale != 1.0:
                group["lr"] = group.get("lr", self.base_lr) * scale
            group["lr_scale"] = scale
            # mmengine matches custom keys against the dotted name ('.name' at the top level)
            custom = any(key in (name if "." in name else "." + name) for key in custom_keys)
            if name in no_decay and not custom:
                group["weight_decay"] = 0.0
            key = repr(sorted((k, v) for k, v in group.items() if k != "params"))
            if key not in merged:
                merged[key] = dict(group, params=[], param_names=[])
            merged[key]["params"] += group["params"]
            merged[key]["param_names"].append(name)
        params.extend(merged.values())
        MMLogger.get_current_instance().info(
            "SR-ViT layer decay %.3f, weight-decay convention %r: %d parameter groups", self.layer_decay_rate,
            self.paramwise_cfg["weight_decay_convention"], len(merged))
