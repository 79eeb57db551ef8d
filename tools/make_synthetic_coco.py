#!/usr/bin/env python
"""Write a small COCO-format instance-segmentation dataset in detectron2's layout:

    ROOT/coco/train2017/*.jpg   ROOT/coco/val2017/*.jpg
    ROOT/coco/annotations/instances_{train,val}2017.json   (polygon masks)

Each image holds a few filled shapes on a textured background: circles, squares and
triangles, labelled with three COCO categories ("sports ball", "tv", "kite"). The JSON
lists all 80 COCO categories with their official ids, so the stock dataset names
(``coco_2017_train`` / ``coco_2017_val``) and metadata apply unchanged:

    python tools/make_synthetic_coco.py --root datasets --train 64 --val 16
    DETECTRON2_DATASETS=datasets python tools/train_net.py --config ...

With ``--categories A B C`` it writes a dataset of your own instead, as labelling tools export
COCO: the three shapes are categories 1..3 under those names (only they are listed), in

    ROOT/{train,val}/*.jpg   ROOT/annotations/{train,val}.json
"""
from srvit_backbones.data.synthetic import coco


def main(argv=None):
    args = coco.parse_args(argv, __doc__)
    for path, images, instances in coco.write_splits(args):
        print(f"wrote {path}: {images} images, {instances} instances")
    if not args.categories:
        print(f"use it with: DETECTRON2_DATASETS={args.root}")


if __name__ == "__main__":
    main()
