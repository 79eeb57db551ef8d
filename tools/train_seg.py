#!/usr/bin/env python
"""Train an SR-ViT segmentor with MMSegmentation's Runner; the arguments of mmseg's own
``tools/train.py``, for users without the mmseg source tree:

    python tools/train_seg.py mmseg_configs/upernet_srvit_s.py
    torchrun --nproc_per_node 8 tools/train_seg.py mmseg_configs/upernet_srvit_s.py --launcher pytorch
    python tools/train_seg.py upernet_srvit_s.py --resume     # configs are also found by name
"""
import argparse

from mmengine.config import DictAction
from mmengine.runner import Runner

from srvit_backbones.mmseg.tools import (add_data_arguments, apply_amp, check_compile, check_data, load_config,
                                         prepare_training)
from srvit_backbones.openmmlab.fine_tune import check_load_from


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train a segmentor")
    parser.add_argument("config", help="train config file path (or the name of a shipped config)")
    parser.add_argument("--work-dir", help="the dir to save logs and models")
    parser.add_argument("--resume", action="store_true", default=False,
                        help="resume from the latest checkpoint in the work_dir automatically")
    parser.add_argument("--amp", action="store_true", default=False, help="enable automatic-mixed-precision training")
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
    cfg.resume = args.resume
    check_data(cfg, ("train_dataloader", "val_dataloader"), read_files=not args.skip_data_check)
    prepare_training(cfg)
    runner = Runner.from_cfg(cfg)
    check_load_from(runner)  # fine-tuning: only the class-dependent layers may differ
    return runner


def main(argv=None):
    build_runner(argv).train()


if __name__ == "__main__":
    main()
