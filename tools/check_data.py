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

from mmengine.config import DictAction

from srvit_backbones.data.check import add_coco_arguments, add_segmentation_arguments
from srvit_backbones.errors import tool_main
from srvit_backbones.frameworks import adapter, framework, framework_of, frameworks, resolve


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file (or the name of a shipped config)")
    parser.add_argument("--framework", choices=frameworks(),
                        help="the config's framework, when its folder or text does not tell")
    add_coco_arguments(parser)
    add_segmentation_arguments(parser)
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, help="mmdet / mmseg: key=value overrides")
    parser.add_argument("opts", nargs="*", help="detectron2: key=value overrides, as tools/train_net.py takes them")
    args = parser.parse_intermixed_args(argv)
    args.framework = args.framework or framework_of(args.config)
    if args.framework is None:
        parser.error(f"cannot tell which framework {args.config} is for: pass --framework")
    task = framework(args.framework).task
    if task != "detection" and (args.coco_train or args.coco_val):
        parser.error(f"--coco-train / --coco-val are for detection configs; {args.framework} takes --seg-train / "
                     f"--seg-val")
    if task != "segmentation" and (args.seg_train or args.seg_val or args.classes):
        parser.error(f"--seg-train / --seg-val / --classes are for segmentation configs; {args.framework} takes "
                     f"--coco-train")
    return args


@tool_main
def main(argv=None):
    args = parse_args(argv)
    try:
        _, path = resolve(args.config, args.framework)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None
    adapter(args.framework).check_data(path, args)


if __name__ == "__main__":
    main()
