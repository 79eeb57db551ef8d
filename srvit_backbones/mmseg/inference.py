"""mmseg's ``MMSegInferencer`` with ``CheckedWeightsInferencer`` (a module of its own: mmseg.apis is large)."""
from mmseg.apis import MMSegInferencer
from mmseg.registry import DATASETS

from ..openmmlab.inference import CheckedWeightsInferencer
from . import SRViTBackbone  # noqa: F401  (registers SRViT)


class SRViTSegInferencer(CheckedWeightsInferencer, MMSegInferencer):
    framework = "mmseg"
    datasets = DATASETS
