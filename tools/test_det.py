#!/usr/bin/env python
"""Evaluate an SR-ViT detector (COCO box and mask AP); the arguments of mmdet's own
``tools/test.py``:

    python tools/test_det.py mmdet_configs/mask_rcnn_srvit_s_t3_lsj.py \\
        work_dirs/mask_rcnn_srvit_s_t3_lsj/iter_270000.pth
    python tools/test_det.py ... --out results.pkl --show-dir vis/
"""
from srvit_backbones.errors import tool_main
from srvit_backbones.openmmlab import entry


@tool_main
def main(argv=None):
    entry.run_test("mmdet", argv)


if __name__ == "__main__":
    main()
