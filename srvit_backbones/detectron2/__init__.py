"""Detectron2 adapter: importing it registers SR-ViT with detectron2.

LazyConfig users build ``SimpleFeaturePyramid(net=SRViTBackbone(...))`` (see
``detectron2_configs/``); yacs users call ``add_srvit_config(cfg)`` and set
``MODEL.BACKBONE.NAME = "build_srvit_sfp_backbone"``.
"""
from .backbone import SRVIT_PREFIX, SRViTBackbone, srvit_lr_factor_func
from .checkpoint import SRViTCheckpointer, is_core_checkpoint
from .validate import validate_config
from .yacs_config import add_srvit_config, build_srvit_sfp_backbone

__all__ = ["SRViTBackbone", "SRViTCheckpointer", "srvit_lr_factor_func", "add_srvit_config",
           "build_srvit_sfp_backbone", "is_core_checkpoint", "SRVIT_PREFIX", "validate_config"]
