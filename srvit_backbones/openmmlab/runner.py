"""``SRViTRunner``: mmengine's Runner built from a config made to survive faults (``tools.prepare_training``),
whichever script builds it: the shipped configs name it (``runner_type``), so ``mim train`` gets it too."""
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
        """mmengine's ``train``.

        Raises:
            ConfigError: mmengine's ``AmpOptimWrapper`` without a GPU, naming the fix (fp32).
        """
        why = amp_without_gpu(self.optim_wrapper) if isinstance(self.optim_wrapper, dict) else None
        if why:
            raise ConfigError(f"{why}: train in fp32, --cfg-options optim_wrapper.type=OptimWrapper (with "
                              f"tools/train.py's --amp, drop --amp too: it sets optim_wrapper.type after "
                              f"--cfg-options)")
        return super().train()
