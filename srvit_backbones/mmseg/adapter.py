"""mmseg's row of the framework table (``srvit_backbones.frameworks``)."""
from ..openmmlab.adapter import OpenMMLabAdapter
from . import tools


class MMSegAdapter(OpenMMLabAdapter):
    """mmseg configs, ``MMSegInferencer``, UPerNet counted in the paper's convention."""

    tools = tools
    checkpoint_hint = "give the iter_N.pth that tools/train_seg.py wrote with this config and the same options"

    def build_demo(self, cfg, checkpoint, device="cpu", amp=False, score_threshold=0.5, opacity=0.5):
        from .demo import MMSegDemo

        return MMSegDemo(cfg, checkpoint, device, amp, opacity, self.checkpoint_hint)

    def count_flops(self, path, counted, plain=False):
        from .flops import count_segmentor

        return count_segmentor(path, counted, plain)

    def time_training(self, config, size, images, device, warmup, steps):
        from .benchmark import segmentor_steps

        return segmentor_steps(config, size, images, device, warmup, steps)
