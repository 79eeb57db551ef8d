#!/usr/bin/env python
"""Evaluate an SR-ViT segmentor (mIoU); the arguments of mmseg's own ``tools/test.py``:

    python tools/test_seg.py mmseg_configs/upernet_srvit_s.py work_dirs/upernet_srvit_s/iter_160000.pth
    python tools/test_seg.py ... --tta          # multi-scale (0.5-1.75) + flip
"""
from srvit_backbones.errors import tool_main
from srvit_backbones.openmmlab import entry


@tool_main
def main(argv=None):
    entry.run_test("mmseg", argv)


if __name__ == "__main__":
    main()
