"""A small LVIS v1 dataset (tools/make_synthetic_lvis.py) of ``coco``'s shapes: images in
``ROOT/coco/{train,val}2017/``, ``ROOT/lvis/lvis_v1_{train,val}.json`` with all 1203 categories
(circles rare, triangles common, squares frequent), ``coco_url``, negative and not-exhaustive lists."""
import json
import os

import numpy as np

from . import coco

SHAPES = {"circle": "beachball", "triangle": "wagon_wheel", "square": "television_set"}  # r, c, f


def lvis_categories():
    """LVIS v1's 1203 categories in id order (detectron2's metadata table)."""
    from detectron2.data.datasets.lvis_v1_categories import LVIS_CATEGORIES

    assert len(LVIS_CATEGORIES) == 1203
    return [dict(id=c["id"], name=c["name"], synset=c["synset"], synonyms=c["synonyms"], **{"def": c["def"]},
                 frequency=c["frequency"]) for c in sorted(LVIS_CATEGORIES, key=lambda c: c["id"])]


def write_split(root, split, count, size, max_shapes, seed, categories):
    """One split (``categories``: ``lvis_categories()``): (annotation file, images, instances)."""
    rng = np.random.default_rng(seed)
    image_dir = os.path.join(root, "coco", f"{split}2017")
    os.makedirs(image_dir, exist_ok=True)
    by_name = {c["name"]: c["id"] for c in categories}
    shape_ids = {coco.SHAPES[kind]: by_name[name] for kind, name in SHAPES.items()}  # COCO id -> LVIS
    images, annotations = [], []
    for i in range(count):
        image, anns = coco.make_image(rng, size, max_shapes)
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
    cats = [dict(c, image_count=len({a["image_id"] for a in annotations if a["category_id"] == c["id"]}),
                 instance_count=sum(a["category_id"] == c["id"] for a in annotations)) for c in categories]
    ann_dir = os.path.join(root, "lvis")
    os.makedirs(ann_dir, exist_ok=True)
    path = os.path.join(ann_dir, f"lvis_v1_{split}.json")
    with open(path, "w") as f:
        json.dump(dict(info=dict(description="srvit-backbones synthetic shapes, LVIS v1 format"),
                       licenses=[dict(id=1, name="synthetic", url="")], images=images, annotations=annotations,
                       categories=cats), f)
    return path, len(images), len(annotations)


def write_splits(args):
    """Both splits of ``coco.parse_args``'s ``args``, one at a time: (annotation file, images,
    instances)."""
    categories = lvis_categories()
    for split, count, seed in coco.splits(args):
        yield write_split(args.root, split, count, tuple(args.size), args.max_shapes, seed, categories)
