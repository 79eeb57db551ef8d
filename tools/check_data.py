#!/usr/bin/env python
"""Check a config's datasets before a long run: every image header and annotation (COCO-format
JSON) or label map (segmentation folders) read once; each kind of defect reported with its count,
the first file names and the fix. Exit status 1 on errors; notes (images without annotations,
grayscale / RGBA / 16-bit images) do not fail. The training tools run the same check first
(``--skip-data-check`` skips it there).

    python tools/check_data.py detectron2_configs/mask_rcnn_srvit_s_t3.py   # COCO below $DETECTRON2_DATASETS
    python tools/check_data.py mmdet_configs/mask_rcnn_srvit_s_t3_lsj.py
    python tools/check_data.py mmseg_configs/upernet_srvit_s.py --cfg-options train_dataloader.dataset.data_root=...
    python tools/check_data.py CONFIG --coco-train train.json train/ --coco-val val.json val/      # detectron2, mmdet
    python tools/check_data.py CONFIG --seg-train images/train labels/train --classes classes.txt  # mmseg

The options for your own data are the training tools' (tools/train_net.py, train_det.py, train_seg.py).
"""
import argparse
import importlib

from mmengine.config import DictAction

from srvit_backbones.config_files import framework_of
from srvit_backbones.data_check import add_coco_arguments, add_segmentation_arguments


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file (or the name of a shipped config)")
    parser.add_argument("--framework", choices=["detectron2", "mmdet", "mmseg"],
                        help="the config's framework, when its folder or text does not tell")
    add_coco_arguments(parser)
    add_segmentation_arguments(parser)
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, help="mmdet / mmseg: key=value overrides")
    parser.add_argument("opts", nargs="*", help="detectron2: key=value overrides, as tools/train_net.py takes them")
    args = parser.parse_intermixed_args(argv)
    args.framework = args.framework or framework_of(args.config)
    if args.framework is None:
        parser.error(f"cannot tell which framework {args.config} is for: pass --framework")
    if args.framework == "mmseg" and (args.coco_train or args.coco_val):
        parser.error("--coco-train / --coco-val are for detection configs; mmseg takes --seg-train / --seg-val")
    if args.framework != "mmseg" and (args.seg_train or args.seg_val or args.classes):
        parser.error("--seg-train / --seg-val / --classes are for mmseg configs; detection takes --coco-train")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.framework == "detectron2":
        from srvit_backbones.detectron2.custom_data import check_config_data
        check_config_data(args.config, args.opts, args.coco_train, args.coco_val)
    else:
        tools = importlib.import_module(f"srvit_backbones.{args.framework}.tools")
        args.launcher, args.work_dir, args.local_rank = "none", None, 0
        tools.check_data(tools.load_config(args), ("train_dataloader", "val_dataloader", "test_dataloader"),
                         read_files=True)


if __name__ == "__main__":
    main()
