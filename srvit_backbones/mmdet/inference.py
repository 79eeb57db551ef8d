"""mmdet's ``DetInferencer`` with ``CheckedWeightsInferencer`` (a module of its own: mmdet.apis is large)."""
from mmdet.apis import DetInferencer
from mmdet.registry import DATASETS

from ..openmmlab.inference import CheckedWeightsInferencer
from . import SRViTDetBackbone  # noqa: F401  (registers SRViT and the pyramid)


class SRViTDetInferencer(CheckedWeightsInferencer, DetInferencer):
    framework = "mmdet"
    datasets = DATASETS
