"""mmseg's ``MMSegInferencer`` with the additions of ``srvit_backbones.openmmlab.inference``
(``tools/demo.py``'s segmentor); imported on its own, as ``mmseg.apis`` is large."""
from mmseg.apis import MMSegInferencer
from mmseg.registry import DATASETS

from ..openmmlab.inference import CheckedWeightsInferencer
from . import SRViTBackbone  # noqa: F401  (registers SRViT)


class SRViTSegInferencer(CheckedWeightsInferencer, MMSegInferencer):
    framework = "mmseg"
    datasets = DATASETS
