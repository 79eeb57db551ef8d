"""Detectron2 adapter: importing it registers SR-ViT with detectron2.

LazyConfig users build ``SimpleFeaturePyramid(net=SRViTBackbone(...))`` and
``optimizer.params = L(srvit_optimizer_params)(...)`` (see ``detectron2_configs/``); yacs
users call ``add_srvit_config(cfg)`` and set ``MODEL.BACKBONE.NAME = "build_srvit_sfp_backbone"``.
``SRViTLVISEvaluator`` is the LVIS configs' ``LVISEvaluator``, which lvis 0.5.3 runs under numpy 2.
Importing it changes nothing in detectron2, fvcore or lvis besides the registries.
"""
from .backbone import SRViTBackbone, find_srvit_backbone, srvit_optimizer_params
from .checkpoint import SRViTCheckpointer, is_core_checkpoint
from .lvis import SRViTLVISEvaluator, fed_loss_cls_weights
from .validate import is_lvis_config, validate_config, validate_lvis_data
from .yacs_config import add_srvit_config, build_srvit_sfp_backbone

__all__ = ["SRViTBackbone", "SRViTCheckpointer", "srvit_optimizer_params", "find_srvit_backbone",
           "add_srvit_config", "build_srvit_sfp_backbone", "is_core_checkpoint", "validate_config",
           "validate_lvis_data", "is_lvis_config", "fed_loss_cls_weights", "SRViTLVISEvaluator"]
