"""Checks of a LazyConfig that catch, with the fix, what detectron2 would fail on later or
handle silently (a square pad smaller than the images crops them)."""
import torch


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
    """Raise ``ValueError`` naming the key and the fix; returns the config."""
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
                         "train.amp.enabled=False to run on the CPU")
    if cfg.train.amp.enabled and not device.startswith("cuda"):
        raise ValueError("train.amp.enabled=True needs a GPU (detectron2's AMPTrainer); pass train.amp.enabled=False")
    return cfg
