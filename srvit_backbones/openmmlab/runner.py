"""``SRViTRunner``: mmengine's Runner built from a config made to survive faults, whichever
script builds it. The shipped configs name it (``runner_type = 'SRViTRunner'``), so mmseg's and
mmdet's own ``tools/train.py`` (what ``mim train`` runs, which build ``RUNNERS.build(cfg)`` when a
config has a ``runner_type``) get what our tools/train_*.py get: the fault hooks where a config
lacks them, the collective timeout, ``AmpOptimWrapper`` on the run's device
(``optim_wrapper.DeviceAmpOptimWrapper``), and ``--launcher pytorch`` on machines without a GPU
(``tools.prepare_training``)."""
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from .tools import prepare_training


@RUNNERS.register_module()  # mmengine's own registry: mmdet's script builds from it, mmseg's from a child of it
class SRViTRunner(Runner):
    """mmengine's ``Runner``; ``from_cfg`` applies ``prepare_training`` to the config first."""

    @classmethod
    def from_cfg(cls, cfg) -> Runner:
        prepare_training(cfg)
        return super().from_cfg(cfg)
