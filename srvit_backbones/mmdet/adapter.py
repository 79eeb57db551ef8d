"""mmdet's row of the framework table (``srvit_backbones.frameworks``)."""
from ..openmmlab.adapter import OpenMMLabAdapter
from . import tools


class MMDetAdapter(OpenMMLabAdapter):
    """mmdet configs, ``DetInferencer``, the detector's ``predict`` counted by fvcore."""

    tools = tools
    checkpoint_hint = ("give the iter_N.pth that tools/train_det.py wrote with this config and the same options "
                       "(a pretraining checkpoint holds only the backbone: train the detector first)")

    def build_demo(self, cfg, checkpoint, device="cpu", amp=False, score_threshold=0.5, opacity=0.5):
        from .demo import MMDetDemo

        return MMDetDemo(cfg, checkpoint, device, amp, score_threshold, self.checkpoint_hint)

    def count_flops(self, path, counted, plain=False):
        from .flops import count_detector

        return count_detector(path, counted, plain)
