"""What the MMSegmentation and MMDetection adapters share: the SR-ViT ``BaseModule``, the
layer-decay optimizer constructor and the torch >= 2.6-safe reading of mmengine checkpoints. It
imports mmengine only; ``srvit_backbones.mmseg`` / ``srvit_backbones.mmdet`` register these
classes in their framework's registries."""
from .backbone import SRViTBackbone
from .optimizer import SRViTLayerDecayOptimizerConstructor

__all__ = ["SRViTBackbone", "SRViTLayerDecayOptimizerConstructor"]
