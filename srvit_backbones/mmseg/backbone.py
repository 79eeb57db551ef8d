"""SR-ViT as an MMSegmentation backbone: a thin ``BaseModule`` around the core model."""
from typing import Optional, Sequence

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from mmseg.registry import MODELS

from ..checkpoint import load_pretrained
from ..layer_decay import layer_depth
from ..models import create_srvit, variant_args
from ..models.factory import default_out_indices


@MODELS.register_module(name="SRViT")
class SRViTBackbone(BaseModule):
    """Args (as mmseg's ``VisionTransformer`` where they overlap):
        variant: a named SR-ViT variant (``srvit_s_t3``, ``srvit_deit_s``, ...).
        img_size: size of the position-embedding table (the crop size, 512 on ADE20K).
        out_indices: units whose outputs are returned (NCHW, stride 16). Default: the
            recursive units (R4, R3, R2, R1), or layers 3/6/9/12 for DeiT; SR-ViT-T's three
            recursive units are followed by its last block to make the four maps UPerNet takes.
        drop_path_rate: stochastic depth over the effective depth.
        with_cp: checkpoint every block application (non-reentrant).
        interpolate_mode: how the position embedding is resized at run time.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads a ``tools/pretrain.py``
            or timm DeiT checkpoint (keys mapped, pos_embed resized, misses logged).
        **overrides: any other core argument (``num_steps``, ``layout``, ``aggregation``...).
    """

    def __init__(self, variant: str = "srvit_s_t3", img_size: int = 512,
                 out_indices: Optional[Sequence[int]] = None, drop_path_rate: float = 0.1,
                 with_cp: bool = False, interpolate_mode: str = "bicubic", prefer_ema: bool = False,
                 init_cfg: Optional[dict] = None, **overrides):
        super().__init__(init_cfg=init_cfg)
        if init_cfg is not None and init_cfg.get("type") == "Pretrained" and not init_cfg.get("checkpoint"):
            raise ValueError("init_cfg=dict(type='Pretrained') needs checkpoint=PATH")
        self.srvit = create_srvit(variant, img_size=img_size, num_classes=0, global_pool="",
                                  drop_path_rate=drop_path_rate, pos_embed_interp=interpolate_mode, **overrides)
        self.srvit.norm = nn.Identity()  # UPerNet/MLN take raw unit outputs; keeps DDP free of unused params
        self.srvit.set_grad_checkpointing(with_cp)
        args = dict(variant_args(variant), **overrides)
        if out_indices is None:
            out_indices = list(default_out_indices(args))
            if len(out_indices) < 4:  # SR-ViT-T has three recursive units: add the last block
                out_indices.append(len(self.srvit.units) - 1)
        self.out_indices = self.srvit._check_indices(list(out_indices))
        self.prefer_ema = prefer_ema

    def init_weights(self):
        if self.init_cfg is not None and self.init_cfg.get("type") == "Pretrained":
            logger = MMLogger.get_current_instance()
            load_pretrained(self.srvit, self.init_cfg["checkpoint"], prefer_ema=self.prefer_ema, log=logger)
            self._is_init = True
            return
        super().init_weights()

    def forward(self, x):
        feats = self.srvit.forward_feature_maps(x, indices=self.out_indices)
        return tuple(feats[f"unit{i}"] for i in self.out_indices)

    def get_layer_depth(self, param_name: str, prefix: str = ""):
        """mmpretrain's protocol: (layer id, number of layer ids) by the shared-block rule."""
        return layer_depth(param_name, self.srvit.unit_sizes, prefix + "srvit.")
