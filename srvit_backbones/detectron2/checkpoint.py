"""``train.init_checkpoint`` for SR-ViT: a DetectionCheckpointer that recognises core
(pretraining / timm DeiT) checkpoints and mmengine ones (an mmdet or mmseg model's
``iter_N.pth``) and loads their backbone into the SR-ViT backbone through the
package's one conversion path (keys mapped, head dropped, position embedding resized),
logging what did not load. Every other file (detectron2's own checkpoints, model-zoo ``.pkl``
files, any state dict) loads as detectron2 loads it, but completely or not at all, as mmdet and
mmseg load: a file that lacks (part of) the SR-ViT backbone is refused unless ``allow_partial``,
and a tensor of another shape is refused, except the class-dependent layers of a detector
trained on other classes, which start from their initialisation (fine-tuning a COCO detector
into a 3-class one) and are listed in the log.

Checkpoints and ``last_checkpoint`` are written whole or not at all (``AtomicWrites``): fvcore
writes them in place, so a process killed mid-write, or a full disk, leaves a truncated file (a
truncated ``model_final.pth`` of an earlier run, rewritten at the end of a resumed one, loses that
run's weights).
"""
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

#: the layers whose size follows the number of classes: box classifier and regression (per
#: cascade stage), mask predictor
CLASS_DEPENDENT = re.compile(r"^roi_heads\.(box_predictor(\.\d+)?\.(cls_score|bbox_pred)|mask_head\.predictor)"
                             r"\.(weight|bias)$")

_DETECTOR_PREFIXES = ("backbone.", "proposal_generator.", "roi_heads.", "pixel_")


class AtomicWrites:
    """fvcore's ``Checkpointer.path_manager`` (``path_manager``'s functions) with the local files it
    opens for writing (checkpoints, ``last_checkpoint``) written whole or not at all
    (``faults.atomic_open``): fvcore writes them in place. Files behind another storage
    (``manifold://``...) are ``path_manager``'s."""

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


def is_mmengine_checkpoint(obj) -> bool:
    """A checkpoint an mmengine Runner saved (mmdet, mmseg): its weights under ``state_dict``,
    its run under ``meta``; the SR-ViT backbone inside is found by its patch embedding."""
    return isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict) and isinstance(obj.get("meta"), dict)


class SRViTCheckpointer(DetectionCheckpointer):
    """Args as DetectionCheckpointer. A core checkpoint loads into every ``SRViTBackbone`` of
    the model with that backbone's ``prefer_ema`` and ``allow_partial`` settings (config keys
    ``model.backbone.net.prefer_ema`` / ``.allow_partial``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.path_manager = AtomicWrites(self.path_manager)

    def save(self, name: str, **kwargs) -> None:
        """``Checkpointer.save``; non-finite weights are not saved (``faults.refuse_non_finite_weights``):
        the run stops instead."""
        refuse_non_finite_weights(self.model.state_dict(), kwargs.get("iteration", -1), last_checkpoint(self),
                                  "--resume", FIXES)
        super().save(name, **kwargs)

    def _load_file(self, filename):
        if filename.endswith((".pth", ".pt", ".bin")):
            obj = read_checkpoint(filename)
            if is_core_checkpoint(obj) or is_mmengine_checkpoint(obj):
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
        for backbone in backbones:  # the report (what did not load) goes to the log
            load_pretrained(backbone.srvit, checkpoint["model"], prefer_ema=backbone.prefer_ema,
                            allow_partial=backbone.allow_partial, log=self.logger)
        self.logger.info("Detector parts outside the backbone start from their initialisation.")
        return None

    def _srvit_backbones(self):
        """(state-dict prefix of the core model, SRViTBackbone) of each SR-ViT backbone."""
        return [(f"{name}.srvit." if name else "srvit.", m) for name, m in self.model.named_modules()
                if isinstance(m, SRViTBackbone)]

    def _resize_backbone_tables(self, weights) -> None:
        """The backbone's position table and relative-position tables of a detector trained at
        another input size resized to this model's (the core's conversion), in place."""
        for prefix, backbone in self._srvit_backbones():
            inside = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
            if "pos_embed" not in inside:
                continue
            report = LoadReport()
            converted = convert_state_dict(inside, backbone.srvit, report)
            for note in report.notes:
                self.logger.info("SR-ViT backbone %s: %s", prefix, note)
            weights.update({prefix + k: v for k, v in converted.items()})

    def _require_fit(self, checkpoint) -> None:
        """A detectron2-format checkpoint against the model, before it loads (after detectron2's
        name matching and the backbone's table resizing): ``require_fine_tune_fit``."""
        if checkpoint.get("matching_heuristics", False):  # detectron2's name matching, done here
            self._convert_ndarray_to_tensor(checkpoint["model"])
            checkpoint["model"] = align_and_update_state_dicts(self.model.state_dict(), checkpoint["model"],
                                                               c2_conversion=checkpoint.get("__author__") == "Caffe2")
            checkpoint["matching_heuristics"] = False
        weights = checkpoint["model"]
        if weights and all(k.startswith("module.") for k in weights):
            weights = checkpoint["model"] = {k[len("module."):]: v for k, v in weights.items()}
        self._resize_backbone_tables(weights)
        backbones = {prefix: backbone.allow_partial for prefix, backbone in self._srvit_backbones()}
        require_fine_tune_fit(weights, self.model.state_dict(), CLASS_DEPENDENT, backbones, self.logger,
                              "train.init_checkpoint", "model.backbone.net.allow_partial=True")
