#!/usr/bin/env python
"""Check a config's datasets before a long run: every image header and annotation (COCO-format
JSON) or label map (segmentation folders) read once; each kind of defect reported with its count,
the first file names and the fix. Exit status 1 on errors; notes (images without annotations,
grayscale / RGBA / 16-bit images) do not fail. The training tools run the same check first
(``--skip-data-check`` skips it there).

    python tools/check_data.py detectron2_configs/mask_rcnn_srvit_s_t3.py          # COCO below $DETECTRON2_DATASETS
    python tools/check_data.py mmdet_configs/mask_rcnn_srvit_s_t3_lsj.py
    python tools/check_data.py mmseg_configs/upernet_srvit_s.py --cfg-options train_dataloader.dataset.data_root=...
    python tools/check_data.py CONFIG --coco-train train.json train/ --coco-val val.json val/      # detectron2, mmdet
    python tools/check_data.py CONFIG --seg-train images/train labels/train --classes classes.txt  # mmseg

The options for your own data are the training tools' (tools/train_net.py, train_det.py, train_seg.py).
"""
import argparse
import importlib
import sys

from srvit_backbones.config_files import framework_of


def adapter(framework):
    """The module that holds a framework's data options and check."""
    return importlib.import_module("srvit_backbones.detectron2.custom_data" if framework == "detectron2"
                                   else f"srvit_backbones.{framework}.tools")


def parse_args(argv=None):
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("config")
    first.add_argument("--framework", choices=["detectron2", "mmdet", "mmseg"])
    known, _ = first.parse_known_args(argv)
    framework = known.framework or framework_of(known.config)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file (or the name of a shipped config)")
    parser.add_argument("--framework", choices=["detectron2", "mmdet", "mmseg"],
                        help="the config's framework, when its folder or text does not tell")
    if framework is not None:
        adapter(framework).add_data_arguments(parser, with_skip=False)
    if framework == "detectron2":
        parser.add_argument("opts", nargs="*", help="key=value overrides, as tools/train_net.py")
    elif framework is not None:
        from mmengine.config import DictAction
        parser.add_argument("--cfg-options", nargs="+", action=DictAction, help="key=value overrides")
    args = parser.parse_intermixed_args(argv)
    if framework is None:
        parser.error(f"cannot tell which framework {args.config} is for: pass --framework")
    args.framework = framework
    return args


def main(argv=None):
    args = parse_args(argv)
    tools = adapter(args.framework)
    if args.framework == "detectron2":
        tools.check_config_data(args.config, args.opts, args.coco_train, args.coco_val)
    else:
        args.launcher, args.work_dir, args.local_rank = "none", None, 0
        tools.check_data(tools.load_config(args), ("train_dataloader", "val_dataloader", "test_dataloader"),
                         read_files=True)


if __name__ == "__main__":
    sys.exit(main())
