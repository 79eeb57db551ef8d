"""MMDetection adapter: importing it registers, in mmdet's registries, the ``SRViT`` backbone
(one stride-16 map by default: ViTDet's pyramid input), the ``SimpleFeaturePyramid`` neck and
its ``LayerNorm2d``, the ``SRViTLayerDecayOptimizerConstructor`` and the
``Fp16CompressionHook``: what mmdet's ``projects/ViTDet`` gives, which the pip wheel lacks;
and the fault hooks (``SRViTCheckpointHook``, ``DivergenceCheckHook``) with the ``SRViTRunner``
the configs name (``runner_type``); and the ``SRViTLVISMetric`` of the LVIS configs (mmdet's
``LVISMetric`` under numpy 2).
Configs import it with ``custom_imports = dict(imports=['srvit_backbones.mmdet'])``; importing it
changes nothing in mmdet, mmengine or lvis besides their registries."""
from typing import List

from mmdet.evaluation.metrics import LVISMetric
from mmdet.registry import HOOKS, METRICS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS

from ..data.lvis import lvis_under_numpy2
from ..openmmlab import SRViTBackbone, SRViTLayerDecayOptimizerConstructor, checkpoint_loading  # noqa: F401
from ..openmmlab.hooks import DivergenceCheckHook, Fp16CompressionHook, SRViTCheckpointHook
from ..openmmlab.runner import SRViTRunner
from .cascade import SingleMaskCascadeRoIHead  # noqa: F401  (registers it)
from .losses import FederatedSigmoidCELoss  # noqa: F401  (registers it)
from .neck import LayerNorm2d, SimpleFeaturePyramid


@MODELS.register_module(name="SRViT")
class SRViTDetBackbone(SRViTBackbone):
    __doc__ = SRViTBackbone.__doc__.replace(
        "Default: the\n            multi-level maps UPerNet takes (``default_out_indices``)",
        "Default: the\n            last block's output, the one map ViTDet's pyramid takes")

    def default_out_indices(self) -> List[int]:
        return [len(self.srvit.feature_points) - 1]


@METRICS.register_module()
class SRViTLVISMetric(LVISMetric):
    """mmdet's ``LVISMetric`` (the LVIS configs' metric), computing inside
    ``srvit_backbones.data.lvis.lvis_under_numpy2``: lvis 0.5.3 fails under numpy 2 otherwise."""

    def compute_metrics(self, results):
        with lvis_under_numpy2():
            return super().compute_metrics(results)


MODELS.register_module(module=SimpleFeaturePyramid)
MODELS.register_module(module=LayerNorm2d)
OPTIM_WRAPPER_CONSTRUCTORS.register_module(module=SRViTLayerDecayOptimizerConstructor)
HOOKS.register_module(module=Fp16CompressionHook)
HOOKS.register_module(module=SRViTCheckpointHook)
HOOKS.register_module(module=DivergenceCheckHook)

__all__ = ["SRViTDetBackbone", "SimpleFeaturePyramid", "LayerNorm2d", "SRViTLayerDecayOptimizerConstructor",
           "Fp16CompressionHook", "SRViTCheckpointHook", "DivergenceCheckHook", "SRViTRunner", "SRViTLVISMetric"]
