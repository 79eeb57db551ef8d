"""Small synthetic datasets in the layouts the frameworks read, to try the tools and to test
them without the real data (tools/make_synthetic_coco.py, make_synthetic_lvis.py,
make_synthetic_ade20k.py): filled shapes on a textured background, each shape's class telling
its form, so that a model learns them in a few iterations.

- ``coco``: COCO 2017's layout and categories (detectron2's builtin names, mmdet's
  ``data_root``), or a custom COCO-format set of up to three classes;
- ``lvis``: LVIS v1's files (all 1203 categories, frequency groups, negative and
  not-exhaustive lists) over ``coco``'s images;
- ``ade20k``: ADE20K's image and label-map folders (mmseg's ``ADE20KDataset``), or a custom set
  with its class file.

numpy and PIL only; the category tables of COCO and LVIS v1 are read from detectron2's metadata
module when a dataset in their layout is written. The same arguments and seed write the same
bytes."""
import argparse


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
