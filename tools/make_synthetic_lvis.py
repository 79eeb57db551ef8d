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
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_synthetic_coco  # noqa: E402  (the shapes)

SHAPES = {"circle": "beachball", "triangle": "wagon_wheel", "square": "television_set"}  # r, c, f


def lvis_categories():
    from detectron2.data.datasets.lvis_v1_categories import LVIS_CATEGORIES

    assert len(LVIS_CATEGORIES) == 1203
    return [dict(id=c["id"], name=c["name"], synset=c["synset"], synonyms=c["synonyms"], def_=c["def"],
                 frequency=c["frequency"]) for c in sorted(LVIS_CATEGORIES, key=lambda c: c["id"])]


def write_split(root, split, count, size, max_shapes, seed, categories):
    rng = np.random.default_rng(seed)
    image_dir = os.path.join(root, "coco", f"{split}2017")
    os.makedirs(image_dir, exist_ok=True)
    by_name = {c["name"]: c["id"] for c in categories}
    shape_ids = {make_synthetic_coco.SHAPES[kind]: by_name[name] for kind, name in SHAPES.items()}  # COCO id -> LVIS
    images, annotations = [], []
    for i in range(count):
        image, anns = make_synthetic_coco.make_image(rng, size, max_shapes)
        name = f"{i:012d}.jpg"
        image.save(os.path.join(image_dir, name), quality=95)
        present = sorted({shape_ids[a["category_id"]] for a in anns})
        images.append(dict(id=i + 1, coco_url=f"http://images.cocodataset.org/{split}2017/{name}",
                           height=size[0], width=size[1], license=1, flickr_url="", date_captured="",
                           neg_category_ids=sorted(set(shape_ids.values()) - set(present)),
                           not_exhaustive_category_ids=present[:1] if i % 4 == 3 else []))
        for ann in anns:
            annotations.append(dict(id=len(annotations) + 1, image_id=i + 1, category_id=shape_ids[ann["category_id"]],
                                    segmentation=ann["segmentation"], bbox=ann["bbox"], area=ann["area"]))
    cats = []
    for c in categories:
        c = {("def" if k == "def_" else k): v for k, v in c.items()}
        c["image_count"] = len({a["image_id"] for a in annotations if a["category_id"] == c["id"]})
        c["instance_count"] = sum(a["category_id"] == c["id"] for a in annotations)
        cats.append(c)
    ann_dir = os.path.join(root, "lvis")
    os.makedirs(ann_dir, exist_ok=True)
    path = os.path.join(ann_dir, f"lvis_v1_{split}.json")
    with open(path, "w") as f:
        json.dump(dict(info=dict(description="srvit-backbones synthetic shapes, LVIS v1 format"),
                       licenses=[dict(id=1, name="synthetic", url="")], images=images, annotations=annotations,
                       categories=cats), f)
    return path, len(images), len(annotations)


def main(argv=None):
    args = make_synthetic_coco.parse_args(argv, __doc__)
    categories = lvis_categories()
    for split, count, seed in make_synthetic_coco.splits(args):
        path, n_img, n_ann = write_split(args.root, split, count, tuple(args.size), args.max_shapes, seed, categories)
        print(f"wrote {path}: {n_img} images, {n_ann} instances")
    print(f"use it with: DETECTRON2_DATASETS={args.root}")


if __name__ == "__main__":
    main()
