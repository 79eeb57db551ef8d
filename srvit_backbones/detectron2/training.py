"""What tools/train_net.py and the benchmarks share: a LazyConfig with its overrides, its model and
optimizer, and its trainer (``SimpleTrainer``, or ``AMPTrainer`` with ``train.amp.enabled``)."""
import torch
from detectron2.config import LazyConfig, instantiate
from detectron2.engine import AMPTrainer, SimpleTrainer

from ..config_files import resolve_config
from .custom_data import use_coco_files

#: ``train.amp.precision``: AMPTrainer's autocast dtype by name (left out: fp16)
AMP_PRECISIONS = {"fp16": torch.float16, "bf16": torch.bfloat16}


def load_config(config_file, opts=(), coco_train=None, coco_val=None):
    """The config ``config_file`` names (a path or a shipped name) with ``coco_train`` / ``coco_val``
    (``custom_data.use_coco_files``) and then the overrides ``opts`` applied.

    Raises:
        FileNotFoundError: no such config. ValueError: ``coco_val`` without ``coco_train``.
    """
    cfg = LazyConfig.load(resolve_config("detectron2", config_file))
    if coco_train:
        use_coco_files(cfg, coco_train, coco_val)
    elif coco_val:
        raise ValueError("--coco-val needs --coco-train (the training split sizes the head)")
    return LazyConfig.apply_overrides(cfg, list(opts))


def build_model(cfg, device=None):
    """``cfg.model`` on ``device`` (default: ``cfg.train.device``)."""
    return instantiate(cfg.model).to(device or cfg.train.device)


def build_optimizer(cfg, model):
    """``cfg.optimizer`` over ``model``'s parameters (the config's parameter groups)."""
    cfg.optimizer.params.model = model
    return instantiate(cfg.optimizer)


def trainer_class(cfg):
    """The trainer ``cfg.train.amp`` asks for, as (class, keyword arguments).

    Raises:
        ValueError: ``train.amp.precision`` names no dtype, or ``train.amp.enabled`` on a device other than CUDA.
    """
    precision = cfg.train.amp.get("precision", None)
    if precision is not None and precision not in AMP_PRECISIONS:
        raise ValueError(f"train.amp.precision={precision!r} is not one of {tuple(AMP_PRECISIONS)}: name the autocast "
                         f"dtype (train.amp.precision=fp16 or bf16), or leave it out for fp16; for fp32 pass "
                         f"train.amp.enabled=False")
    if not cfg.train.amp.enabled:
        return SimpleTrainer, {}
    device = cfg.train.get("device", "cuda")
    if torch.device(device).type != "cuda":
        raise ValueError(f"train.amp.enabled=True trains in mixed precision with detectron2's AMPTrainer, which needs "
                         f"a CUDA GPU, and train.device is {device!r}: pass train.amp.enabled=False to train in fp32")
    return AMPTrainer, dict(precision=AMP_PRECISIONS[precision or "fp16"])


def build_trainer(cfg, model, data_loader, optimizer):
    """The trainer ``trainer_class`` names over ``model``, ``data_loader`` and ``optimizer``."""
    kind, kwargs = trainer_class(cfg)
    return kind(model, data_loader, optimizer, **kwargs)
