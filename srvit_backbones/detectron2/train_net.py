"""tools/train_net.py's work: detectron2's ``tools/lazyconfig_train_net.py`` with the SR-ViT checks (data,
config, ``train.init_checkpoint``), the checkpointer and the divergence check; ``main`` runs in each process."""
import logging
import os

from detectron2.config import instantiate
from detectron2.engine import default_setup, default_writers, hooks
from detectron2.engine.defaults import create_ddp_model
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm

from ..config_files import resolve_config
from ..data.check import add_coco_arguments, add_skip_argument
from ..errors import CheckpointError, ConfigError
from . import faults, training, validate
from .checkpoint import SRViTCheckpointer

logger = logging.getLogger("srvit.train_net")


def parse_args(parser, argv=None):
    """``argv`` parsed by detectron2's ``default_argument_parser`` with ``--config``, ``--coco-*`` and
    ``--skip-data-check`` added."""
    parser.add_argument("--config", dest="config_file", metavar="FILE", help="alias of --config-file")
    add_coco_arguments(parser)  # your own data: --coco-train, --coco-val
    add_skip_argument(parser)
    args = parser.parse_args(argv)
    if not args.config_file:
        parser.error("--config (or --config-file) is required")
    return args


def check_config(cfg):
    """Fail early with the fix: ``ConfigError``, or ``CheckpointError`` for a missing ``train.init_checkpoint``."""
    try:
        validate.validate_config(cfg)
    except ValueError as e:
        raise ConfigError(f"config error: {e}") from None
    ckpt = cfg.train.init_checkpoint
    if ckpt and "://" not in ckpt and not os.path.isfile(ckpt):
        raise CheckpointError(f"train.init_checkpoint={ckpt!r} does not exist: produce it with tools/pretrain.py "
                              f"(or tools/convert_checkpoint.py), point train.init_checkpoint at it, or set "
                              f"train.init_checkpoint='' to start from scratch")
    if not ckpt:
        logger.warning("train.init_checkpoint is empty: the backbone starts from random initialisation")


def ddp_kwargs(cfg):
    """``create_ddp_model``'s arguments: ``train.ddp``, without ``device_ids`` and fp16 compression on the CPU."""
    kwargs = dict(cfg.train.ddp)
    if not cfg.train.device.startswith("cuda"):
        kwargs["device_ids"] = None  # CPU (gloo) DDP
        kwargs["fp16_compression"] = False
    return kwargs


def do_test(cfg, model):
    """The config's evaluator on its test loader, printed as detectron2's copypaste lines."""
    if "evaluator" in cfg.dataloader:
        ret = inference_on_dataset(model, instantiate(cfg.dataloader.test), instantiate(cfg.dataloader.evaluator))
        print_csv_format(ret)
        return ret
    return None


def build_eval_model(cfg):
    """The ``--eval-only`` model, with ``train.init_checkpoint`` loaded."""
    model = create_ddp_model(training.build_model(cfg), **ddp_kwargs(cfg))
    SRViTCheckpointer(model).load(cfg.train.init_checkpoint)
    return model


def build_trainer(args, cfg):
    """A training run's trainer, loaded from ``train.init_checkpoint`` or, with ``--resume``, restored from
    ``train.output_dir``; returns (trainer, start_iter)."""
    model = training.build_model(cfg)
    logger.info("Model:\n%s", model)
    optim = training.build_optimizer(cfg, model)
    train_loader = instantiate(cfg.dataloader.train)
    model = create_ddp_model(model, **ddp_kwargs(cfg))
    trainer = training.build_trainer(cfg, model, train_loader, optim)
    trainer.checkpointer = checkpointer = SRViTCheckpointer(model, cfg.train.output_dir, trainer=trainer)
    trainer.register_hooks([
        hooks.IterationTimer(),
        hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
        faults.DivergenceCheck(checkpointer),
        hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer) if comm.is_main_process() else None,
        hooks.EvalHook(cfg.train.eval_period, lambda: do_test(cfg, model)),
        hooks.PeriodicWriter(default_writers(cfg.train.output_dir, cfg.train.max_iter),
                             period=cfg.train.log_period) if comm.is_main_process() else None,
    ])
    checkpointer.resume_or_load(cfg.train.init_checkpoint, resume=args.resume)
    start_iter = trainer.iter + 1 if args.resume and checkpointer.has_checkpoint() else 0
    return trainer, start_iter


def do_train(args, cfg):
    """``build_trainer``'s run to ``train.max_iter``; a divergence ends it with an explanation."""
    trainer, start_iter = build_trainer(args, cfg)
    with faults.explained_divergence(trainer):
        trainer.train(start_iter, cfg.train.max_iter)


def load_config(args):
    """``training.load_config`` for ``args``; a ``ConfigError`` when the config cannot be found or read."""
    try:
        return training.load_config(args.config_file, args.opts, args.coco_train, args.coco_val)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"config error: {e}") from None


def check_data(args):
    """The data check of tools/check_data.py, once, before the processes start."""
    if not args.skip_data_check:
        validate.check_config_data(args.config_file, args.opts, args.coco_train, args.coco_val)


def main(args):
    """What each process runs: the config set up (``default_setup``), checked, then trained or, with
    ``--eval-only``, evaluated (the metrics returned)."""
    cfg = load_config(args)
    args.config_file = resolve_config("detectron2", args.config_file)  # default_setup logs the file: a path
    default_setup(cfg, args)
    check_config(cfg)
    if args.eval_only:
        return do_test(cfg, build_eval_model(cfg))
    do_train(args, cfg)
