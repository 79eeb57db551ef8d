"""What the MMSegmentation and MMDetection adapters share: the SR-ViT ``BaseModule``, the
layer-decay optimizer constructor, the torch >= 2.6-safe reading of mmengine checkpoints and
the fused attention counted by mmengine's flop counter (mmdet's and mmseg's get_flops.py). It
imports mmengine only; ``srvit_backbones.mmseg`` / ``srvit_backbones.mmdet`` register these
classes in their framework's registries."""
from mmengine.analysis.complexity_analysis import _DEFAULT_SUPPORTED_FLOP_OPS as MMENGINE_FLOP_HANDLES

from .backbone import SRViTBackbone
from .optimizer import SRViTLayerDecayOptimizerConstructor
from ..flops import count_attention_by_default

count_attention_by_default(MMENGINE_FLOP_HANDLES)

__all__ = ["SRViTBackbone", "SRViTLayerDecayOptimizerConstructor"]
