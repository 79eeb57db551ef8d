"""SR-ViT as an OpenMMLab backbone, registered as ``SRViT`` by ``srvit_backbones.mmseg`` and
``srvit_backbones.mmdet`` (mmengine only here)."""
from typing import List, Optional, Sequence

from mmengine.logging import MMLogger
from mmengine.model import BaseModule

from ..checkpoint import load_pretrained
from ..layer_decay import layer_depth
from ..models import create_srvit
from ..models.compiled import compile_options, feature_maps_function


def core_prefix(prefix: Optional[str]) -> Optional[str]:
    """The core's prefix for mmengine's ``prefix`` (``'backbone.'`` -> ``'backbone.srvit.'``); None: the core is
    found by its patch embedding."""
    if not prefix:
        return None
    prefix = prefix if prefix.endswith(".") else prefix + "."
    return prefix if prefix.endswith("srvit.") else prefix + "srvit."


class SRViTBackbone(BaseModule):
    """Args (as mmseg's ``VisionTransformer`` where they overlap):
        variant: a named variant (``srvit_s_t3``, ``srvit_deit_s``, ``bvit_b``, ...).
        img_size: size of the position-embedding table (the crop size).
        out_indices: features returned (NCHW, stride 16): units, or bViT's steps; -1 the last block's
            output. Default ``default_out_indices``. The core is cut after the last of them.
        drop_path_rate: stochastic depth over the effective depth.
        with_cp: checkpoint every block application (non-reentrant).
        interpolate_mode: how the position embedding is resized at run time.
        prefer_ema, allow_partial: ``load_pretrained``'s arguments for a ``Pretrained`` ``init_cfg``.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH, prefix=None)`` (mmengine's ``prefix``).
        compile: ``torch.compile`` the backbone: True, or a dict of its arguments (necks and heads stay eager).
        **overrides: any other core argument (``num_steps``, ``layout``, ``window_size``...)."""

    def __init__(self, variant: str = "srvit_s_t3", img_size: int = 512,
                 out_indices: Optional[Sequence[int]] = None, drop_path_rate: float = 0.1,
                 with_cp: bool = False, interpolate_mode: str = "bicubic", prefer_ema: bool = False,
                 allow_partial: bool = False, init_cfg: Optional[dict] = None, compile=False, **overrides):
        super().__init__(init_cfg=init_cfg)
        self.compile_options = compile_options(compile)
        if init_cfg is not None and init_cfg.get("type") == "Pretrained" and not init_cfg.get("checkpoint"):
            raise ValueError("init_cfg=dict(type='Pretrained') needs checkpoint=PATH")
        self.srvit = create_srvit(variant, img_size=img_size, num_classes=0, global_pool="",
                                  drop_path_rate=drop_path_rate, pos_embed_interp=interpolate_mode, **overrides)
        self.srvit.set_grad_checkpointing(with_cp)
        if out_indices is None:
            out_indices = self.default_out_indices()
        self.out_indices = self.srvit._check_indices(list(out_indices))
        # layer-decay ids count the whole network, before the cut (the same factors as in Detectron2)
        self.layer_decay_unit_sizes = list(self.srvit.unit_sizes)
        # units after the last returned one would get no gradient, which DDP rejects
        self.srvit.prune_intermediate_layers(self.out_indices, prune_norm=True)
        self.prefer_ema = prefer_ema
        self.allow_partial = allow_partial

    def default_out_indices(self) -> List[int]:
        """The core's default features, plus the last block where there are fewer than UPerNet's four."""
        out_indices = list(self.srvit.default_feature_indices)
        if len(out_indices) < 4:
            out_indices.append(len(self.srvit.feature_points) - 1)
        return out_indices

    def init_weights(self):
        if self.init_cfg is not None and self.init_cfg.get("type") == "Pretrained":
            load_pretrained(self.srvit, self.init_cfg["checkpoint"], prefer_ema=self.prefer_ema,
                            allow_partial=self.allow_partial, prefix=core_prefix(self.init_cfg.get("prefix")),
                            log=MMLogger.get_current_instance())
            self._is_init = True
            return
        super().init_weights()  # the core's init_weights(), with the settings it was built with

    def forward(self, x):
        feats = feature_maps_function(self.compile_options)(self.srvit, x, self.out_indices)
        return tuple(feats[self.srvit.feature_name(i)] for i in self.out_indices)

    def no_weight_decay(self):
        """The core's no-weight-decay parameter names, relative to this module."""
        return {"srvit." + name for name in self.srvit.no_weight_decay()}

    def get_layer_depth(self, param_name: str, prefix: str = ""):
        """mmpretrain's protocol: (layer id, number of layer ids) by the shared-block rule."""
        return layer_depth(param_name, self.layer_decay_unit_sizes, prefix + "srvit.")
