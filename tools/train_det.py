#!/usr/bin/env python
"""Train an SR-ViT detector with MMDetection's Runner; the arguments of mmdet's own
``tools/train.py``, for users without the mmdet source tree:

    python tools/train_det.py mmdet_configs/mask_rcnn_srvit_s_t3_lsj.py
    torchrun --nproc_per_node 8 tools/train_det.py mmdet_configs/mask_rcnn_srvit_s_t3_lsj.py --launcher pytorch
    python tools/train_det.py mask_rcnn_srvit_s_t3_lsj.py --resume     # configs are also found by name
"""
from srvit_backbones.errors import tool_main
from srvit_backbones.openmmlab import entry


def build_runner(argv=None):
    """The Runner ``main`` trains: the config with the command line applied, its data checked."""
    return entry.build_train_runner("mmdet", argv)


@tool_main
def main(argv=None):
    entry.run_train("mmdet", argv)


if __name__ == "__main__":
    main()
