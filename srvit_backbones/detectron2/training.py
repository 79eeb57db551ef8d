"""What tools/train_net.py and the benchmarks share: a LazyConfig by path or shipped name with
its overrides, its model and optimizer, and the trainer it asks for."""
from detectron2.config import LazyConfig, instantiate
from detectron2.engine import AMPTrainer, SimpleTrainer

from ..config_files import resolve_config
from .custom_data import use_coco_files


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
    """detectron2's ``AMPTrainer`` (fp16 autocast + GradScaler) where ``train.amp.enabled``,
    else ``SimpleTrainer``."""
    return AMPTrainer if cfg.train.amp.enabled else SimpleTrainer
