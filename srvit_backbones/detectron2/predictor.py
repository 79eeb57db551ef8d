"""detectron2's ``DefaultPredictor`` for LazyConfigs (it reads yacs configs only), loading a
checkpoint only when it fits the model entirely, with mixed precision."""
from types import SimpleNamespace
from typing import Mapping

import torch
from detectron2.config import CfgNode, instantiate
from detectron2.data import MetadataCatalog
from detectron2.data import transforms as T
from detectron2.engine import DefaultPredictor

from ..checkpoint import require_fit
from ..training.amp import autocast


class LazyConfigPredictor(DefaultPredictor):
    """Called as ``DefaultPredictor`` (on a BGR image); the instances come back float32 on the CPU.

    Args:
        cfg: a LazyConfig: its model, test mapper and test dataset's metadata (``self.metadata``).
        weights: a trained model's state dict, loaded only when every tensor fits.
        device, amp, source: where the model runs, in mixed precision; how messages name the checkpoint."""

    def __init__(self, cfg, weights: Mapping[str, torch.Tensor], device: str = "cpu", amp: bool = False,
                 source: str = "the checkpoint"):
        self.cfg = CfgNode({"MODEL": {"DEVICE": device}})  # DefaultPredictor.__call__ reads it
        self.model = instantiate(cfg.model).to(device).eval()
        require_fit(weights, self.model, source, "the detectron2 config's model")
        self.model.load_state_dict(weights)
        mapper = cfg.dataloader.test.mapper
        augmentations = T.AugmentationList(instantiate(mapper.augmentations))
        self.aug = SimpleNamespace(get_transform=lambda image: augmentations(T.AugInput(image)))  # what __call__ calls
        self.input_format = mapper.image_format
        names = cfg.dataloader.test.dataset.names
        self.metadata = MetadataCatalog.get(names if isinstance(names, str) else names[0])
        self.device, self.amp = device, amp

    def __call__(self, original_image):
        with autocast(self.device, self.amp):
            predictions = super().__call__(original_image)
        instances = predictions["instances"].to("cpu")
        for name, value in instances.get_fields().items():  # bf16 / fp16 under amp
            if torch.is_tensor(value) and value.is_floating_point():
                instances.set(name, value.float())
            elif hasattr(value, "tensor") and value.tensor.is_floating_point():
                value.tensor = value.tensor.float()
        return dict(predictions, instances=instances)
