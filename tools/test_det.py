#!/usr/bin/env python
"""Evaluate an SR-ViT detector (COCO box and mask AP); the arguments of mmdet's own
``tools/test.py``:

    python tools/test_det.py mmdet_configs/mask_rcnn_srvit_s_t3_lsj.py work_dirs/mask_rcnn_srvit_s_t3_lsj/iter_270000.pth
    python tools/test_det.py ... --out results.pkl --show-dir vis/
"""
import argparse
import os.path as osp

from mmengine.config import DictAction
from mmengine.runner import Runner

from srvit_backbones.mmdet.tools import check_data, load_config


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="MMDet test (and eval) a model")
    parser.add_argument("config", help="test config file path (or the name of a shipped config)")
    parser.add_argument("checkpoint", help="checkpoint file")
    parser.add_argument("--work-dir", help="the directory to save the file containing evaluation metrics")
    parser.add_argument("--out", help="dump the predictions to this pickle file (mmdet's DumpDetResults)")
    parser.add_argument("--show-dir", help="directory, below the run's folder, where painted images will be saved")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction,
                        help="override some settings in the used config, key=value pairs")
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"], default="none", help="job launcher")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        raise SystemExit(f"checkpoint {args.checkpoint!r} does not exist")
    if args.out is not None and not args.out.endswith((".pkl", ".pickle")):
        raise SystemExit(f"--out {args.out!r}: the dump is a pickle file, give a name ending in .pkl")
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    if args.show_dir:
        cfg.default_hooks.visualization.update(draw=True, test_out_dir=args.show_dir)
    check_data(cfg, ("test_dataloader",))  # before --out's evaluator: its messages name the config's paths
    if args.out is not None:
        cfg.test_evaluator = [*(cfg.test_evaluator if isinstance(cfg.test_evaluator, list) else [cfg.test_evaluator]),
                              dict(type="DumpDetResults", out_file_path=args.out)]
    Runner.from_cfg(cfg).test()


if __name__ == "__main__":
    main()
