#!/usr/bin/env python
"""Train an SR-ViT detector with MMDetection's Runner; the arguments of mmdet's own
``tools/train.py``, for users without the mmdet source tree:

    python tools/train_det.py mmdet_configs/mask_rcnn_srvit_s_t3_lsj.py
    torchrun --nproc_per_node 8 tools/train_det.py mmdet_configs/mask_rcnn_srvit_s_t3_lsj.py --launcher pytorch
    python tools/train_det.py mask_rcnn_srvit_s_t3_lsj.py --resume     # configs are also found by name
"""
import argparse

from mmengine.config import DictAction
from mmengine.runner import Runner

from srvit_backbones.mmdet.tools import (add_data_arguments, apply_amp, check_compile, check_data, load_config,
                                         prepare_training)
from srvit_backbones.openmmlab.fine_tune import check_load_from


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train a detector")
    parser.add_argument("config", help="train config file path (or the name of a shipped config)")
    parser.add_argument("--work-dir", help="the dir to save logs and models")
    parser.add_argument("--amp", action="store_true", default=False, help="enable automatic-mixed-precision training")
    parser.add_argument("--auto-scale-lr", action="store_true", help="scale the lr by the total batch size")
    parser.add_argument("--resume", nargs="?", type=str, const="auto",
                        help="resume from this checkpoint, or without a path from the latest one in the work dir")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction,
                        help="override some settings in the used config, key=value pairs")
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"], default="none", help="job launcher")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0)
    add_data_arguments(parser)  # your own data (--coco-train... / --seg-train...), --skip-data-check
    return parser.parse_args(argv)


def build_runner(argv=None) -> Runner:
    """The Runner ``main`` trains: the config with the command line applied, its data checked."""
    args = parse_args(argv)
    cfg = load_config(args)
    apply_amp(cfg, args.amp)
    check_compile(cfg)
    if args.auto_scale_lr:
        if "auto_scale_lr" not in cfg or "base_batch_size" not in cfg.auto_scale_lr:
            raise SystemExit("--auto-scale-lr needs auto_scale_lr=dict(base_batch_size=...) in the config")
        cfg.auto_scale_lr.enable = True
    if args.resume == "auto":
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    check_data(cfg, ("train_dataloader", "val_dataloader"), read_files=not args.skip_data_check)
    prepare_training(cfg)
    runner = Runner.from_cfg(cfg)
    check_load_from(runner)  # fine-tuning: only the class-dependent layers may differ
    return runner


def main(argv=None):
    build_runner(argv).train()


if __name__ == "__main__":
    main()
