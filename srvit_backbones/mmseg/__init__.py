"""MMSegmentation adapter: importing it registers ``SRViT`` in mmseg's ``MODELS``, the
``SRViTLayerDecayOptimizerConstructor``, the fault hooks (``SRViTCheckpointHook``,
``DivergenceCheckHook``), the ``SRViTRunner`` the configs name (``runner_type``) and a torch >=
2.6-safe checkpoint loader.
Configs import it with ``custom_imports = dict(imports=['srvit_backbones.mmseg'])``."""
from mmseg.registry import HOOKS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS

from ..openmmlab import SRViTBackbone, SRViTLayerDecayOptimizerConstructor, checkpoint_loading  # noqa: F401
from ..openmmlab.hooks import DivergenceCheckHook, SRViTCheckpointHook
from ..openmmlab.runner import SRViTRunner

MODELS.register_module(name="SRViT", module=SRViTBackbone)
OPTIM_WRAPPER_CONSTRUCTORS.register_module(module=SRViTLayerDecayOptimizerConstructor)
HOOKS.register_module(module=SRViTCheckpointHook)
HOOKS.register_module(module=DivergenceCheckHook)

__all__ = ["SRViTBackbone", "SRViTLayerDecayOptimizerConstructor", "SRViTCheckpointHook", "DivergenceCheckHook",
           "SRViTRunner"]
