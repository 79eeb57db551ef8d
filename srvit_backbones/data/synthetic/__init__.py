"""Small synthetic datasets in the layouts the frameworks read (COCO, LVIS v1, ADE20K, or custom
sets), to try the tools and test them without the real data: filled shapes on a textured
background, each shape's class telling its form, learnt in a few iterations. numpy and PIL only
(COCO's and LVIS's category tables from detectron2); the same arguments and seed write the same bytes."""
import argparse
import math


def regular_polygon(cx: float, cy: float, r: float, sides: int, phase: float = 0.0):
    """The corners of a regular polygon of radius ``r`` (a circle: many of them), the first at angle ``phase``."""
    return [(cx + r * math.cos(phase + 2 * math.pi * i / sides), cy + r * math.sin(phase + 2 * math.pi * i / sides))
            for i in range(sides)]


def dataset_parser(description: str, root_help: str, train: int, val: int, size, count_help: bool = True):
    """The options every maker has: ``--root``, ``--train`` / ``--val`` (image counts, ``train``
    and ``val`` by default), ``--size H W``, ``--max-shapes`` and ``--seed``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="datasets", help=root_help)
    parser.add_argument("--train", type=int, default=train, help="number of training images" if count_help else None)
    parser.add_argument("--val", type=int, default=val, help="number of validation images" if count_help else None)
    parser.add_argument("--size", type=int, nargs=2, default=list(size), metavar=("H", "W"))
    parser.add_argument("--max-shapes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def parse_dataset_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``argv`` parsed, at least one image asked of each split."""
    args = parser.parse_args(argv)
    if args.train < 1 or args.val < 1:
        parser.error("--train and --val must be at least 1")
    return args
