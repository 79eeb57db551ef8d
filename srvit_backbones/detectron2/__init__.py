"""Detectron2 adapter: importing it registers SR-ViT with detectron2.

LazyConfig users build ``SimpleFeaturePyramid(net=SRViTBackbone(...))`` and
``optimizer.params = L(srvit_optimizer_params)(...)`` (see ``detectron2_configs/``); yacs
users call ``add_srvit_config(cfg)`` and set ``MODEL.BACKBONE.NAME = "build_srvit_sfp_backbone"``.
Importing it also makes fvcore's flop counter count fused attention
(``srvit_backbones.flops.count_attention_by_default``), as detectron2's tools/analyze_model.py runs it.
"""
from fvcore.nn.flop_count import _DEFAULT_SUPPORTED_OPS as FVCORE_FLOP_HANDLES

from .backbone import SRViTBackbone, find_srvit_backbone, srvit_optimizer_params
from .checkpoint import SRViTCheckpointer, is_core_checkpoint
from .lvis import fed_loss_cls_weights
from .validate import is_lvis_config, validate_config, validate_lvis_data
from .yacs_config import add_srvit_config, build_srvit_sfp_backbone
from ..flops import count_attention_by_default
from ..lvis import patch_lvis_for_numpy2

patch_lvis_for_numpy2()  # LVISEvaluator under numpy 2
count_attention_by_default(FVCORE_FLOP_HANDLES)  # detectron2's analyze_model.py counts fused attention

__all__ = ["SRViTBackbone", "SRViTCheckpointer", "srvit_optimizer_params", "find_srvit_backbone",
           "add_srvit_config", "build_srvit_sfp_backbone", "is_core_checkpoint", "validate_config",
           "validate_lvis_data", "is_lvis_config", "fed_loss_cls_weights"]
