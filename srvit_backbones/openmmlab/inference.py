"""What tools/demo.py adds to mmdet's and mmseg's inferencers: weights loaded only when they fit, the test
dataset's classes for a checkpoint that names none, mixed precision with float32 predictions."""
import re
from typing import Mapping, Optional

import torch
from mmengine.structures import BaseDataElement

from ..analysis.demo import read_weights, refused_unless_it_fits
from ..checkpoint import require_fit
from ..training.amp import autocast


class CheckedWeightsInferencer:
    """Mixin before an mmengine inferencer; subclasses set ``framework`` and ``datasets`` (its registry).

    Args:
        cfg, kwargs: the config, the inferencer's own arguments.
        checkpoint, source: a checkpoint read already; how messages name it.
        device, amp: where the model runs, and in mixed precision."""

    framework: str
    datasets = None

    def __init__(self, cfg, checkpoint: Mapping, source: str, device: Optional[str] = None, amp: bool = False,
                 **kwargs):
        self.checkpoint, self.source = checkpoint, source
        self.amp_device, self.amp = device or "cpu", amp
        super().__init__(model=cfg, weights=None, device=device, **kwargs)  # the weights come from checkpoint
        self.show_progress = False

    @classmethod
    def from_file(cls, cfg, checkpoint: str, device: Optional[str] = None, amp: bool = False, hint: str = ""):
        """The inferencer of ``cfg`` with the weights of the file ``checkpoint``.

        Raises:
            CheckpointError: they do not fit; says, with ``hint``, where a checkpoint that fits comes from."""
        read, _ = read_weights(checkpoint, "state_dict", cls.framework, hint)
        with refused_unless_it_fits(hint):
            return cls(cfg, read, checkpoint, device=device, amp=amp)

    def _load_weights_to_model(self, model, checkpoint, cfg) -> None:
        weights = self.checkpoint.get("state_dict", self.checkpoint)
        weights = {re.sub(r"^module\.", "", k): v for k, v in weights.items()}  # as mmengine's loader
        require_fit(weights, model, self.source, f"the {self.framework} config's model")
        meta = dict(self.checkpoint.get("meta") or {})
        if not meta.get("dataset_meta"):
            meta["dataset_meta"] = self.datasets.get(cfg.test_dataloader.dataset.type).METAINFO
        super()._load_weights_to_model(model, {"state_dict": weights, "meta": meta}, cfg)

    def forward(self, inputs, **kwargs):
        with autocast(self.amp_device, self.amp):
            predictions = super().forward(inputs, **kwargs)
        for sample in predictions:  # bf16 / fp16 under amp: float32 for drawing and saving
            for _, element in sample.items():
                if isinstance(element, BaseDataElement):
                    for name, value in element.items():
                        if torch.is_tensor(value) and value.is_floating_point():
                            setattr(element, name, value.float())
        return predictions
