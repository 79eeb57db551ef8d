"""SR-ViT as an OpenMMLab backbone: a thin ``BaseModule`` around the core model, registered as
``SRViT`` in mmseg's ``MODELS`` by ``srvit_backbones.mmseg`` and in mmdet's by
``srvit_backbones.mmdet`` (mmengine only here: no registry of either is imported)."""
from typing import List, Optional, Sequence

from mmengine.logging import MMLogger
from mmengine.model import BaseModule

from ..checkpoint import load_pretrained
from ..layer_decay import layer_depth
from ..models import create_srvit
from ..models.compiled import compile_options, feature_maps_function


def core_prefix(prefix: Optional[str]) -> Optional[str]:
    """mmengine's ``prefix`` names where this module's keys (``srvit.*``) sit in the checkpoint
    (``'backbone.'``); the core's keys are one level deeper. A prefix that already names the
    core (``'backbone.srvit.'``) is kept. None: the core is found by its patch embedding."""
    if not prefix:
        return None
    prefix = prefix if prefix.endswith(".") else prefix + "."
    return prefix if prefix.endswith("srvit.") else prefix + "srvit."


class SRViTBackbone(BaseModule):
    """Args (as mmseg's ``VisionTransformer`` where they overlap):
        variant: a named variant (``srvit_s_t3``, ``srvit_deit_s``, ``bvit_b``, ...).
        img_size: size of the position-embedding table (the crop size: 512 on ADE20K, 1024
            for LSJ on COCO).
        out_indices: features returned (NCHW, stride 16): units, or bViT's recursion steps;
            -1 is the last block's output (ViTDet's Simple Feature Pyramid input). Default: the
            multi-level maps UPerNet takes (``default_out_indices``). The core is cut after the
            last of them: later units (and steps) are neither held nor run.
        drop_path_rate: stochastic depth over the effective depth.
        with_cp: checkpoint every block application (non-reentrant).
        interpolate_mode: how the position embedding is resized at run time.
        prefer_ema: load the EMA weights of a pretraining checkpoint when it has them.
        allow_partial: let a ``Pretrained`` checkpoint that lacks some backbone weights load
            (they keep their initialisation and are listed in the log) instead of raising.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH, prefix=None)`` loads a
            ``tools/pretrain.py``, timm DeiT or mmengine checkpoint (keys mapped, pos_embed
            resized, a missing backbone weight is an error unless ``allow_partial``);
            ``prefix`` is mmengine's: where this backbone sits in a whole-model checkpoint
            (``'backbone.'``); without it the backbone is found by its patch embedding.
        compile: ``torch.compile`` the backbone (its forward and backward, in training and
            inference): True for torch.compile's defaults (inductor), or a dict of its
            arguments (``dict(mode='max-autotune')``, ``dict(backend='aot_eager')``), as
            mmengine's ``cfg.compile``, which compiles the whole ``train_step`` instead. The
            necks and heads stay eager; mmengine's DDP wrapper is unchanged
            (``srvit_backbones.models.compiled``).
        **overrides: any other core argument (``num_steps``, ``layout``, ``aggregation``,
            ``zero_init_recursion``, ``window_size``, ``token_merge_ratio``...).
    """

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
        # Layer-decay ids count the whole pretrained network, so a parameter gets the same
        # factor as in Detectron2 whichever units are returned here.
        self.layer_decay_unit_sizes = list(self.srvit.unit_sizes)
        # A unit after the last returned one would get no gradient, which DDP with
        # find_unused_parameters=False (mmengine's default) rejects; the final norm likewise.
        self.srvit.prune_intermediate_layers(self.out_indices, prune_norm=True)
        self.prefer_ema = prefer_ema
        self.allow_partial = allow_partial

    def default_out_indices(self) -> List[int]:
        """The recursive units (R4, R3, R2, R1), layers 3/6/9/12 for DeiT, steps T/4, T/2, 3T/4,
        T for bViT; SR-ViT-T's three recursive units are followed by its last block to make
        the four maps UPerNet takes."""
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
