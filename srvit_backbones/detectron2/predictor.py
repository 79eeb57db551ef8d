"""detectron2's ``DefaultPredictor`` for the LazyConfigs of ``detectron2_configs/`` (it reads
yacs configs only), with what ``tools/demo.py`` adds: a checkpoint loaded only when it fits the
model entirely, and mixed precision (bf16 on a CPU with native bf16)."""
from typing import Mapping

import torch
from detectron2.config import CfgNode, instantiate
from detectron2.data import MetadataCatalog
from detectron2.data import transforms as T
from detectron2.engine import DefaultPredictor

from ..amp import autocast
from ..checkpoint import require_fit


class _TestAugmentations:
    """The config's test-time augmentations behind the one ``get_transform(image)`` that
    ``DefaultPredictor`` calls on its resize."""

    def __init__(self, augmentations):
        self.augmentations = T.AugmentationList(augmentations)

    def get_transform(self, image):
        return self.augmentations(T.AugInput(image))


class LazyConfigPredictor(DefaultPredictor):
    """Args:
        cfg: a LazyConfig: its model, its test mapper's augmentations and image format, its
            test dataset's metadata (``self.metadata``, for detectron2's ``Visualizer``).
        weights: a trained model's state dict (``model_final.pth``'s ``"model"``), loaded only
            when every tensor fits (``srvit_backbones.checkpoint.require_fit``).
        device: where the model runs.
        amp: mixed precision (``srvit_backbones.amp``: fp16 on CUDA, bf16 on the CPU).
        source: how messages name the checkpoint.

    Called as ``DefaultPredictor``, on a BGR image; returns the model's outputs with the
    instances float32 on the CPU, whatever the precision they were computed in."""

    def __init__(self, cfg, weights: Mapping[str, torch.Tensor], device: str = "cpu", amp: bool = False,
                 source: str = "the checkpoint"):
        # what DefaultPredictor.__init__ takes from a yacs config, taken from the LazyConfig
        self.cfg = CfgNode({"MODEL": {"DEVICE": device}})  # DefaultPredictor.__call__ reads it
        self.model = instantiate(cfg.model).to(device).eval()
        require_fit(weights, self.model, source, "the detectron2 config's model")
        self.model.load_state_dict(weights)
        mapper = cfg.dataloader.test.mapper
        self.aug = _TestAugmentations(instantiate(mapper.augmentations))
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
