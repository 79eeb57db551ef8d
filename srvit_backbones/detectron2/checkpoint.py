"""detectron2's checkpointer for SR-ViT: loads completely or not at all, writes whole (docs/checkpoints.md)."""
import re

from detectron2.checkpoint import DetectionCheckpointer
from detectron2.checkpoint.c2_model_loading import align_and_update_state_dicts

from ..checkpoint import (
    LoadReport,
    convert_state_dict,
    extract_state_dict,
    load_pretrained,
    read_checkpoint,
    require_fine_tune_fit,
)
from ..training.faults import atomic_open, refuse_non_finite_weights
from .backbone import SRViTBackbone
from .faults import FIXES, last_checkpoint

#: the layers whose size follows the number of classes
CLASS_DEPENDENT = re.compile(r"^roi_heads\.(box_predictor(\.\d+)?\.(cls_score|bbox_pred)|mask_head\.predictor)"
                             r"\.(weight|bias)$")

_DETECTOR_PREFIXES = ("backbone.", "proposal_generator.", "roi_heads.", "pixel_")


class AtomicWrites:
    """``path_manager`` with the local files opened for writing going through ``faults.atomic_open``."""

    def __init__(self, path_manager):
        self.path_manager = path_manager

    def open(self, path: str, mode: str = "r", **kwargs):
        if "w" in mode and "://" not in path:
            return atomic_open(path, mode)
        return self.path_manager.open(path, mode, **kwargs)

    def __getattr__(self, name):
        return getattr(self.path_manager, name)


def is_core_checkpoint(obj) -> bool:
    """A checkpoint of the core model (no detector keys, but a ViT's embeddings)."""
    try:
        sd = extract_state_dict(obj, prefer_ema=False)
    except ValueError:
        return False
    return "pos_embed" in sd and not any(k.startswith(_DETECTOR_PREFIXES) for k in sd)


class SRViTCheckpointer(DetectionCheckpointer):
    """Args as DetectionCheckpointer; a core checkpoint loads into every ``SRViTBackbone``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.path_manager = AtomicWrites(self.path_manager)

    def save(self, name: str, **kwargs) -> None:
        """``Checkpointer.save``, refusing non-finite weights (``faults.refuse_non_finite_weights``)."""
        refuse_non_finite_weights(self.model.state_dict(), kwargs.get("iteration", -1), last_checkpoint(self),
                                  "--resume", FIXES)
        super().save(name, **kwargs)

    def _load_file(self, filename):
        if filename.endswith((".pth", ".pt", ".bin")):
            obj = read_checkpoint(filename)
            mmengine = isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict) and \
                isinstance(obj.get("meta"), dict)  # an mmdet or mmseg Runner's
            if is_core_checkpoint(obj) or mmengine:
                return {"model": obj, "__srvit_core__": True}
        return super()._load_file(filename)

    def _load_model(self, checkpoint):
        if not checkpoint.pop("__srvit_core__", False):
            self._require_fit(checkpoint)
            return super()._load_model(checkpoint)
        backbones = [m for m in self.model.modules() if isinstance(m, SRViTBackbone)]
        if not backbones:
            raise ValueError("train.init_checkpoint is an SR-ViT (or mmengine) checkpoint, but the model has no "
                             "SRViTBackbone")
        for backbone in backbones:
            load_pretrained(backbone.srvit, checkpoint["model"], prefer_ema=backbone.prefer_ema,
                            allow_partial=backbone.allow_partial, log=self.logger)
        self.logger.info("Detector parts outside the backbone start from their initialisation.")

    def _require_fit(self, checkpoint) -> None:
        """``require_fine_tune_fit`` after detectron2's name matching and the backbones' table resizing."""
        if checkpoint.get("matching_heuristics", False):
            self._convert_ndarray_to_tensor(checkpoint["model"])
            checkpoint["model"] = align_and_update_state_dicts(self.model.state_dict(), checkpoint["model"],
                                                               c2_conversion=checkpoint.get("__author__") == "Caffe2")
            checkpoint["matching_heuristics"] = False
        weights = checkpoint["model"]
        if weights and all(k.startswith("module.") for k in weights):
            weights = checkpoint["model"] = {k[len("module."):]: v for k, v in weights.items()}
        srvits = [(f"{name}.srvit." if name else "srvit.", m) for name, m in self.model.named_modules()
                  if isinstance(m, SRViTBackbone)]  # (state-dict prefix of the core model, backbone)
        for prefix, backbone in srvits:
            inside = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
            if "pos_embed" not in inside:
                continue
            report = LoadReport()
            converted = convert_state_dict(inside, backbone.srvit, report)
            for note in report.notes:
                self.logger.info("SR-ViT backbone %s: %s", prefix, note)
            weights.update({prefix + k: v for k, v in converted.items()})  # tables resized to this model's
        backbones = {prefix: backbone.allow_partial for prefix, backbone in srvits}
        require_fine_tune_fit(weights, self.model.state_dict(), CLASS_DEPENDENT, backbones, self.logger,
                              "train.init_checkpoint", "model.backbone.net.allow_partial=True")
