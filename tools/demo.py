#!/usr/bin/env python
"""Draw a trained SR-ViT model's predictions on images with each framework's own inference API:
detectron2's ``DefaultPredictor`` (for our LazyConfigs: detectron2's demo/demo.py reads only yacs
configs) and ``Visualizer``, mmdet's ``DetInferencer``, mmseg's ``MMSegInferencer``. It reads
LazyConfigs, mmdet and mmseg configs, by path or by shipped name; the framework follows from the
config. Added to them: the checkpoint must fit the model entirely (a ``LoadReport`` of what does
not, instead of a logged partial load), ``--save-raw`` and ``--amp`` (bf16 on a CPU with native bf16).

    python tools/demo.py detectron2_configs/quickstart/mask_rcnn_srvit_tiny_cpu.py \\
        --checkpoint output/quickstart_detectron2/model_final.pth --input datasets/coco/val2017 \\
        --output output/quickstart_detectron2/demo --save-raw
    python tools/demo.py upernet_srvit_s.py --checkpoint work_dirs/upernet_srvit_s/iter_160000.pth \\
        --input 'photos/*.jpg' --output demo/ --amp
    python tools/demo.py mask_rcnn_srvit_s_t3_lsj.py --checkpoint work_dirs/mask_rcnn_srvit_s_t3_lsj/iter_270000.pth \\
        --input photos/ --output demo/ --save-raw
    python tools/demo.py output/my_run/config.yaml --checkpoint output/my_run/model_final.pth --input a.jpg \\
        --output demo/ --score-threshold 0.3 --opts model.roi_heads.box_predictor.test_nms_thresh=0.3

Writes OUTPUT/NAME.png per image (NAME: the image's path below the inputs' common folder) and,
with --save-raw, OUTPUT/predictions.json (detection: COCO results, RLE masks, dataset category
ids) or OUTPUT/labels/NAME.png (segmentation: the class index of every pixel).
"""
import argparse
import os

import torch

from srvit_backbones.analysis.demo import check_device, relative_names, run_demo
from srvit_backbones.analysis.images import find_images
from srvit_backbones.errors import tool_main
from srvit_backbones.frameworks import adapter, frameworks, load_config


@tool_main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file, or the name of a shipped config (mask_rcnn_srvit_s_t3.py)")
    parser.add_argument("--checkpoint", required=True,
                        help="trained weights: tools/train_net.py's model_final.pth, tools/train_seg.py's or "
                             "tools/train_det.py's iter_N.pth")
    parser.add_argument("--input", nargs="+", required=True,
                        help="image files, folders (searched recursively) or globs")
    parser.add_argument("--output", required=True, help="folder for the drawn images (and raw predictions)")
    parser.add_argument("--framework", choices=frameworks(), help="default: inferred from the config")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true",
                        help="mixed precision: fp16 on CUDA, bf16 on a CPU with native bf16")
    parser.add_argument("--score-threshold", type=float, default=0.5,
                        help="detection: draw and save the detections scoring above it")
    parser.add_argument("--opacity", type=float, default=0.5, help="segmentation: opacity of the drawn class colours")
    parser.add_argument("--save-raw", action="store_true",
                        help="also write predictions.json (detection) or labels/*.png (segmentation)")
    parser.add_argument("--opts", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides")
    args = parser.parse_args(argv)
    paths = find_images(args.input)
    names = relative_names(paths)
    try:
        framework, cfg = load_config(args.config, args.framework, args.opts)
    except (FileNotFoundError, ValueError) as e:  # no such config, or not one its framework reads
        raise SystemExit(str(e)) from None
    check_device(args.device, args.amp)
    demo = adapter(framework).build_demo(cfg, args.checkpoint, args.device, args.amp, args.score_threshold,
                                         args.opacity)
    drawn, raw, empty = run_demo(demo, paths, names, args.output, args.save_raw)
    if empty:
        print(f"{len(empty)} of {len(paths)} images: {demo.empty_message()} ({', '.join(empty[:5])}"
              f"{', ...' if len(empty) > 5 else ''})")
    print(f"predictions drawn on {len(drawn)} images: {os.path.join(args.output, '')}")
    if raw:
        print(f"raw predictions: {raw[0] if len(raw) == 1 else os.path.join(args.output, 'labels', '')}")


if __name__ == "__main__":
    main()
