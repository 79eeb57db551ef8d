"""``SRViTRunner``: mmengine's Runner built from a config made to survive faults, whichever
script builds it. The shipped configs name it (``runner_type = 'SRViTRunner'``), so mmseg's and
mmdet's own ``tools/train.py`` (what ``mim train`` runs, which build ``RUNNERS.build(cfg)`` when a
config has a ``runner_type``) get what our tools/train_*.py get: the fault hooks where a config
lacks them, the collective timeout, ``--launcher pytorch`` on machines without a GPU
(``tools.prepare_training``), and mixed precision without a GPU refused naming the fix."""
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ..errors import ConfigError
from .tools import amp_without_gpu, prepare_training


@RUNNERS.register_module()  # mmengine's own registry: mmdet's script builds from it, mmseg's from a child of it
class SRViTRunner(Runner):
    """mmengine's ``Runner``; ``from_cfg`` applies ``prepare_training`` to the config first."""

    @classmethod
    def from_cfg(cls, cfg) -> Runner:
        prepare_training(cfg)
        return super().from_cfg(cfg)

    def train(self):
        """mmengine's ``train``, after refusing mmengine's ``AmpOptimWrapper`` on a run without a
        GPU (``tools.amp_without_gpu``), which mmengine's asserts as ``train`` builds it, without
        naming the fix.

        Raises:
            ConfigError: naming the fix, fp32 (``optim_wrapper.type=OptimWrapper``).
        """
        why = amp_without_gpu(self.optim_wrapper) if isinstance(self.optim_wrapper, dict) else None
        if why:
            raise ConfigError(f"{why}: train in fp32, --cfg-options optim_wrapper.type=OptimWrapper (with "
                              f"tools/train.py's --amp, drop --amp too: it sets optim_wrapper.type after --cfg-options)")
        return super().train()
