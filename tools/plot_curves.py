#!/usr/bin/env python
"""Training curves as a picture: loss(es), learning rate and the evaluation metric(s) over
iterations, from a Detectron2 run's ``metrics.json`` or an MMSegmentation / MMDetection run's
``vis_data/scalars.json`` (both one JSON object per line), or from the run's folder:

    python tools/plot_curves.py output/quickstart_detectron2            # -> output/quickstart_detectron2/curves.png
    python tools/plot_curves.py output/quickstart_mmseg --output mmseg.png
    python tools/plot_curves.py output/quickstart_mmdet

How a resumed run's logs are joined and the three frameworks drawn alike (the evaluation at its
iteration, the base lr, AP in percent): ``srvit_backbones.training.curves``.
"""
import argparse

from srvit_backbones.errors import tool_main
from srvit_backbones.training.curves import plot_curves


@tool_main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="metrics.json, scalars.json, or a run's output / work dir")
    parser.add_argument("--output", help="PNG to write (default: curves.png in the run's folder)")
    args = parser.parse_args(argv)
    _, output = plot_curves(args.path, args.output)
    print(f"training curves: {output}")


if __name__ == "__main__":
    main()
