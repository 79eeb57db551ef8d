#!/usr/bin/env python
"""Train / evaluate an SR-ViT Mask R-CNN with a LazyConfig, like detectron2's
``tools/lazyconfig_train_net.py``:

    python tools/train_net.py --config detectron2_configs/mask_rcnn_srvit_s_t3.py --num-gpus 8
    python tools/train_net.py --config ... --eval-only train.init_checkpoint=output/model_final.pth
    python tools/train_net.py --config ... --resume                 # continue from output_dir
    python tools/train_net.py --config ... train.max_iter=1000 dataloader.train.total_batch_size=8
    python tools/train_net.py --config ... --coco-train train.json train/ --coco-val val.json val/   # your data

Configs are found by path, or by name through the installed package
(``--config mask_rcnn_srvit_s_t3.py``). ``train.init_checkpoint`` takes a
``tools/pretrain.py`` checkpoint, a timm DeiT state dict, or a detectron2 checkpoint; a
pretraining checkpoint that lacks backbone weights is refused unless
``model.backbone.net.allow_partial=True``. The datasets' files are checked before the model is
built (tools/check_data.py's check; ``--skip-data-check`` skips it).
"""
import logging
import os
import sys

from detectron2.config import instantiate
from detectron2.engine import default_argument_parser, default_setup, default_writers, hooks
from detectron2.engine.defaults import create_ddp_model
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm

from srvit_backbones.config_files import resolve_config
from srvit_backbones.data_check import add_coco_arguments, add_skip_argument
from srvit_backbones.detectron2 import SRViTCheckpointer, custom_data, faults, training, validate_config

logger = logging.getLogger("srvit.train_net")


def check_config(cfg):
    """Fail early, with the fix, on settings that would fail deep inside detectron2."""
    try:
        validate_config(cfg)
    except ValueError as e:
        sys.exit(f"config error: {e}")
    ckpt = cfg.train.init_checkpoint
    if ckpt and "://" not in ckpt and not os.path.isfile(ckpt):
        sys.exit(f"train.init_checkpoint={ckpt!r} does not exist: produce it with tools/pretrain.py "
                 f"(or tools/convert_checkpoint.py), point train.init_checkpoint at it, or set "
                 f"train.init_checkpoint='' to start from scratch")
    if not ckpt:
        logger.warning("train.init_checkpoint is empty: the backbone starts from random initialisation")


def ddp_kwargs(cfg):
    kwargs = dict(cfg.train.ddp)
    if not cfg.train.device.startswith("cuda"):
        kwargs["device_ids"] = None  # CPU (gloo) DDP
        kwargs["fp16_compression"] = False
    return kwargs


def do_test(cfg, model):
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
    """Model, optimizer, data, hooks and checkpointer of a training run, loaded from
    ``train.init_checkpoint`` or, with ``--resume``, restored from the last checkpoint in
    ``train.output_dir`` (weights, optimizer, iteration). Returns (trainer, start_iter)."""
    model = training.build_model(cfg)
    logger.info("Model:\n%s", model)
    optim = training.build_optimizer(cfg, model)
    train_loader = instantiate(cfg.dataloader.train)
    model = create_ddp_model(model, **ddp_kwargs(cfg))
    trainer = training.trainer_class(cfg)(model, train_loader, optim)
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
    trainer, start_iter = build_trainer(args, cfg)
    with faults.explained_divergence(trainer):
        trainer.train(start_iter, cfg.train.max_iter)


def load_config(args):
    """The config named by ``args`` (a path or a shipped name) with its ``key=value`` overrides."""
    try:
        return training.load_config(args.config_file, args.opts, args.coco_train, args.coco_val)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"config error: {e}")


def check_data(args):
    """The data check of tools/check_data.py, once, before the processes start."""
    if not args.skip_data_check:
        custom_data.check_config_data(args.config_file, args.opts, args.coco_train, args.coco_val)


def main(args):
    cfg = load_config(args)
    args.config_file = resolve_config("detectron2", args.config_file)  # default_setup logs the file: a path
    default_setup(cfg, args)
    check_config(cfg)
    if args.eval_only:
        return do_test(cfg, build_eval_model(cfg))
    do_train(args, cfg)


def parse_args(argv=None):
    parser = default_argument_parser(epilog=__doc__)
    parser.add_argument("--config", dest="config_file", metavar="FILE", help="alias of --config-file")
    add_coco_arguments(parser)  # your own data: --coco-train, --coco-val
    add_skip_argument(parser)
    args = parser.parse_args(argv)
    if not args.config_file:
        parser.error("--config (or --config-file) is required")
    return args


if __name__ == "__main__":
    args = parse_args()
    check_data(args)
    faults.launch(main, args)
