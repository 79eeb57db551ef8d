#!/usr/bin/env python
"""Speed and memory of SR-ViT against its anchors, of variants side by side, of whole Mask
R-CNN training steps, compiled against eager, and of the relative-position attention kernels
(``--help`` says how). The harness is ``srvit_backbones.analysis.benchmark`` (``runner`` is this tool;
the detector steps are ``srvit_backbones.detectron2.benchmark``).

    python tools/benchmark.py --model srvit_s_t3 --size 224 --batch-size 8
    python tools/benchmark.py --model srvit_s_t3 --size 1024 --batch-size 2 --amp --references \\
        vit_same_depth vitdet_same_depth --variant global: --variant win:window_size=14,use_rel_pos=True
    python tools/benchmark.py --detector reference/mask_rcnn_vitdet_b.py mask_rcnn_srvit_s_t3_win.py \\
        --batch-size 1 --amp
    python tools/benchmark.py --model srvit_s_t3 --references --compile both
    python tools/benchmark.py --attention --size 1024 --batch-size 2
"""
from srvit_backbones.analysis.benchmark import runner
from srvit_backbones.errors import tool_main

main = tool_main(runner.main)

if __name__ == "__main__":
    main()
