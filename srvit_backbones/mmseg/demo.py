"""mmseg's demo (``MMSegAdapter.build_demo``): ``MMSegInferencer``; its raw output is the label map."""
from ..analysis.demo import Demo
from .inference import SRViTSegInferencer


class MMSegDemo(Demo):
    """Args:
        cfg: an mmseg config.
        checkpoint: tools/train_seg.py's iter_N.pth, refused unless it fits the model entirely.
        device, amp, hint: where the model runs, in mixed precision; the fix a refused checkpoint's error names.
        opacity: of the drawn class colours."""

    raw_output = "label_maps"

    def __init__(self, cfg, checkpoint: str, device: str = "cpu", amp: bool = False, opacity: float = 0.5,
                 hint: str = ""):
        self.inferencer = SRViTSegInferencer.from_file(cfg, checkpoint, device, amp, hint)
        self.opacity = opacity

    def predict(self, path):
        """(the image with its segmentation drawn, the (H, W) class index of every pixel)."""
        out = self.inferencer(path, return_vis=True, opacity=self.opacity)
        return out["visualization"], out["predictions"]

    def label_map(self, prediction):
        return prediction
