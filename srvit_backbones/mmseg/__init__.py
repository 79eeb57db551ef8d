"""MMSegmentation adapter: importing it registers ``SRViT`` in mmseg's ``MODELS``, the
``SRViTLayerDecayOptimizerConstructor``, and a torch >= 2.6-safe checkpoint loader.
Configs import it with ``custom_imports = dict(imports=['srvit_backbones.mmseg'])``."""
from . import checkpoint_loading  # noqa: F401
from .backbone import SRViTBackbone
from .optimizer import SRViTLayerDecayOptimizerConstructor

__all__ = ["SRViTBackbone", "SRViTLayerDecayOptimizerConstructor"]
