#!/usr/bin/env python
"""Train an SR-ViT segmentor with MMSegmentation's Runner; the arguments of mmseg's own
``tools/train.py``, for users without the mmseg source tree:

    python tools/train_seg.py mmseg_configs/upernet_srvit_s.py
    torchrun --nproc_per_node 8 tools/train_seg.py mmseg_configs/upernet_srvit_s.py --launcher pytorch
    python tools/train_seg.py upernet_srvit_s.py --resume     # configs are also found by name
"""
from srvit_backbones.errors import tool_main
from srvit_backbones.openmmlab import entry


def build_runner(argv=None):
    """The Runner ``main`` trains: the config with the command line applied, its data checked."""
    return entry.build_train_runner("mmseg", argv)


@tool_main
def main(argv=None):
    entry.run_train("mmseg", argv)


if __name__ == "__main__":
    main()
