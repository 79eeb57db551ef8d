"""What tools/train_net.py and the benchmarks share: a LazyConfig by path or shipped name with
its overrides, its model and optimizer, and the trainer it asks for."""
from detectron2.config import LazyConfig, instantiate
from detectron2.engine import AMPTrainer, SimpleTrainer

from ..config_files import resolve_config


def load_config(config_file, opts=()):
    """The config named by ``config_file`` (a path or a shipped name such as
    ``mask_rcnn_srvit_s_t3.py``) with its ``key=value`` overrides; FileNotFoundError naming
    the shipped configs when there is none."""
    return LazyConfig.apply_overrides(LazyConfig.load(resolve_config("detectron2", config_file)), list(opts))


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
