"""Checks of a LazyConfig that catch, with the fix, what detectron2 would fail on later or do silently."""
import torch

from ..data.check import run_check
from ..errors import ConfigError
from .custom_data import check_num_classes, data_splits, dataset_names
from .training import load_config, trainer_class


def _max_image_side(augmentations):
    side = 0
    for aug in augmentations or []:
        for key in ("crop_size", "max_size", "target_height", "target_width"):
            value = aug.get(key) if hasattr(aug, "get") else None
            if value is not None:
                values = [value] if isinstance(value, (int, float)) else list(value)  # list, tuple, ListConfig
                side = max(side, *(int(v) for v in values))
    return side


def validate_config(cfg):
    """The config, checked: a ``ValueError`` naming the key and the fix otherwise."""
    net = cfg.model.backbone.get("net", {})
    patch = int(net.get("patch_size", 16)) if hasattr(net, "get") else 16
    square_pad = int(cfg.model.backbone.get("square_pad", 0) or 0)
    if square_pad:
        if square_pad % patch:
            raise ValueError(f"model.backbone.square_pad={square_pad} is not a multiple of the patch size {patch}: "
                             f"use a multiple of {patch} (e.g. {square_pad // patch * patch + patch})")
        for split in ("train", "test"):
            loader = cfg.dataloader.get(split)
            if loader is None or "mapper" not in loader:
                continue
            side = _max_image_side(loader.mapper.get("augmentations"))
            if side > square_pad:
                raise ValueError(
                    f"dataloader.{split} produces images of up to {side} pixels, larger than "
                    f"model.backbone.square_pad={square_pad} (they would be cropped): raise square_pad "
                    f"to at least {-(-side // patch) * patch} or shrink the {split} augmentations")
    device = cfg.train.get("device", "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("train.device is 'cuda' but no GPU is available: pass train.device=cpu "
                         "train.amp.enabled=False to run on the CPU (mixed precision needs a CUDA GPU)")
    trainer_class(cfg)  # train.amp on this device: the trainer, or the error naming the fix
    validate_lvis_data(cfg)  # first: an LVIS config on a COCO file also has other classes
    check_num_classes(cfg)
    return cfg


def is_lvis_config(cfg) -> bool:
    """A config that evaluates with LVISEvaluator or trains a box predictor with the federated loss."""
    evaluator = cfg.dataloader.get("evaluator")
    target = evaluator.get("_target_") if hasattr(evaluator, "get") else None
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    roi = cfg.model.get("roi_heads", {})
    predictors = list(roi.get("box_predictors") or []) + ([roi.box_predictor] if "box_predictor" in roi else [])
    return name.endswith("LVISEvaluator") or any(p.get("use_fed_loss", False) for p in predictors)


def validate_lvis_data(cfg):
    """An LVIS config's datasets must be LVIS-format files: else a ``ValueError`` naming the fix."""
    from detectron2.data import DatasetCatalog, MetadataCatalog

    from ..data.lvis import check_lvis_annotations

    if not is_lvis_config(cfg):
        return cfg
    for key, name in dataset_names(cfg):
        if name not in DatasetCatalog.list():
            continue
        json_file = MetadataCatalog.get(name).get("json_file")
        if json_file is None:
            raise ValueError(f"{key}={name!r} has no json_file in its metadata: an LVIS config needs a dataset "
                             f"registered from an LVIS v1 file (detectron2.data.datasets.register_lvis_instances)")
        check_lvis_annotations(json_file, f"{key}={name!r}: its file")
    return cfg


def check_config_data(config_file, opts=(), coco_train=None, coco_val=None) -> None:
    """tools/check_data.py's check of a LazyConfig (also run by tools/train_net.py first).

    Raises:
        ConfigError: the config against its data. DataCheckError: the data's files.
    """
    try:
        cfg = load_config(config_file, opts, coco_train, coco_val)
        validate_lvis_data(cfg)
        check_num_classes(cfg)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"config error: {e}") from None
    run_check(data_splits(cfg), "--skip-data-check")
