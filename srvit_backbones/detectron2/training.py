"""What tools/train_net.py and the benchmarks share: a LazyConfig by path or shipped name with
its overrides, its model and optimizer, and the trainer it asks for: detectron2's
``SimpleTrainer``, or with ``train.amp.enabled`` its ``AMPTrainer`` (on CUDA)."""
import torch
from detectron2.config import LazyConfig, instantiate
from detectron2.engine import AMPTrainer, SimpleTrainer

from ..config_files import resolve_config
from .custom_data import use_coco_files

#: ``train.amp.precision``: AMPTrainer's autocast dtype by name (left out: fp16)
AMP_PRECISIONS = {"fp16": torch.float16, "bf16": torch.bfloat16}


def load_config(config_file, opts=(), coco_train=None, coco_val=None):
    """The config named by ``config_file`` (a path or a shipped name such as
    ``mask_rcnn_srvit_s_t3.py``) with its ``key=value`` overrides; FileNotFoundError naming
    the shipped configs when there is none. ``coco_train`` / ``coco_val``: (json_file,
    image_root) of a COCO-format dataset to train and evaluate on (``custom_data.use_coco_files``),
    applied before the overrides."""
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
    """The trainer ``cfg.train.amp`` asks for, as (class, keyword arguments): detectron2's
    ``SimpleTrainer``, or with ``train.amp.enabled`` its ``AMPTrainer`` (autocast and a GradScaler,
    CUDA only) in ``train.amp.precision`` (left out: fp16, AMPTrainer's default).

    Raises:
        ValueError: naming the fix, where ``train.amp.precision`` names no dtype (checked whether or
            not ``train.amp.enabled`` is set, so a typo is an error either way), or where
            ``train.amp.enabled`` asks for mixed precision on a ``train.device`` other than CUDA.
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
    """The trainer tools/train_net.py runs (``trainer_class``) over ``model``, ``data_loader`` and
    ``optimizer``."""
    kind, kwargs = trainer_class(cfg)
    return kind(model, data_loader, optimizer, **kwargs)
