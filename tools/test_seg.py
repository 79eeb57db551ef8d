#!/usr/bin/env python
"""Evaluate an SR-ViT segmentor (mIoU); the arguments of mmseg's own ``tools/test.py``:

    python tools/test_seg.py mmseg_configs/upernet_srvit_s.py work_dirs/upernet_srvit_s/iter_160000.pth
    python tools/test_seg.py ... --tta          # multi-scale (0.5-1.75) + flip
"""
import argparse
import os.path as osp

from mmengine.config import DictAction
from mmengine.runner import Runner

from srvit_backbones.mmseg.tools import check_data, load_config


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="MMSeg test (and eval) a model")
    parser.add_argument("config", help="test config file path (or the name of a shipped config)")
    parser.add_argument("checkpoint", help="checkpoint file")
    parser.add_argument("--work-dir", help="the directory to save the file containing evaluation metrics")
    parser.add_argument("--out", help="the directory to save the output prediction")
    parser.add_argument("--show-dir", help="directory where painted images will be saved")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction,
                        help="override some settings in the used config, key=value pairs")
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"], default="none", help="job launcher")
    parser.add_argument("--tta", action="store_true", help="test time augmentation (multi-scale + flip)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        raise SystemExit(f"checkpoint {args.checkpoint!r} does not exist")
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    if args.show_dir:
        cfg.default_hooks.visualization.update(draw=True, show=False, img_dir=args.show_dir)
    if args.tta:
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.tta_model.module = cfg.model
        cfg.model = cfg.tta_model
    if args.out is not None:
        cfg.test_evaluator["output_dir"] = args.out
        cfg.test_evaluator["keep_results"] = True
    check_data(cfg, ("test_dataloader",))
    Runner.from_cfg(cfg).test()


if __name__ == "__main__":
    main()
