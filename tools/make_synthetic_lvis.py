#!/usr/bin/env python
"""Write a small LVIS-v1-format instance-segmentation dataset, beside make_synthetic_coco.py's COCO:

    ROOT/coco/train2017/*.jpg   ROOT/coco/val2017/*.jpg          (the images, as LVIS v1 keeps them)
    ROOT/lvis/lvis_v1_{train,val}.json                            (polygon masks)

detectron2's layout (the builtin ``lvis_v1_train`` / ``lvis_v1_val`` names, with
DETECTRON2_DATASETS=ROOT); for mmdet, ``data_root=ROOT/coco/`` and ``ann_file`` the json (an
image's path is its ``coco_url`` after ``http://images.cocodataset.org/``).

The images are make_synthetic_coco.py's shapes, labelled with three LVIS v1 categories of the
three frequency groups: circles "beachball" (rare), triangles "wagon_wheel" (common), squares
"television_set" (frequent). The JSON is what the ``lvis`` package and both frameworks read:
all 1203 LVIS v1 categories with their official ids, ``frequency`` (r/c/f), ``synset``,
``synonyms`` and this split's ``image_count`` / ``instance_count``; images with ``coco_url``,
``neg_category_ids`` (the shapes verified absent: LVIS evaluates a category on an image only where
it is annotated or listed there) and ``not_exhaustive_category_ids`` (a shape of the image, on
every fourth image: its false positives are not counted there).

    python tools/make_synthetic_lvis.py --root datasets --train 64 --val 16
    DETECTRON2_DATASETS=datasets python tools/train_net.py --config lvis/mask_rcnn_srvit_s_t3.py ...
"""
from srvit_backbones.data.synthetic import coco, lvis


def main(argv=None):
    args = coco.parse_args(argv, __doc__, custom_categories=False)  # make_synthetic_coco.py's options
    for path, images, instances in lvis.write_splits(args):
        print(f"wrote {path}: {images} images, {instances} instances")
    print(f"use it with: DETECTRON2_DATASETS={args.root}")


if __name__ == "__main__":
    main()
