"""SR-ViT backbones: one core model (torch + timm) with thin Detectron2 / MMDetection /
MMSegmentation adapters.

Importing this package registers the SR-ViT variants with timm; it never imports detectron2,
mmdet or mmseg (import ``srvit_backbones.detectron2`` / ``.mmdet`` / ``.mmseg``). What the tools ask of a
framework goes through the one table of the ``srvit_backbones.frameworks`` module (its
``frameworks()`` lists the table's names).
"""
from .checkpoint import LoadReport, load_pretrained
from .config_files import config_dir, config_folders, config_path, list_configs, resolve_config
from .errors import CheckpointError, ConfigError, DataCheckError, InputError, SRViTError
from .frameworks import FrameworkAdapter, adapter, load_config, register_framework, resolve
from .models import VARIANTS, SoftMoRUnit, SRViT, create_srvit, make_layout

__version__ = "0.1.0"
__all__ = ["SRViT", "SoftMoRUnit", "VARIANTS", "create_srvit", "make_layout", "load_pretrained", "LoadReport",
           "SRViTError", "CheckpointError", "ConfigError", "DataCheckError", "InputError", "config_dir",
           "config_folders", "config_path", "list_configs", "resolve_config", "FrameworkAdapter", "adapter",
           "load_config", "register_framework", "resolve"]
