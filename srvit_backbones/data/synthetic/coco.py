"""A small COCO-format instance-segmentation dataset (tools/make_synthetic_coco.py): COCO 2017's
layout (``ROOT/coco/{train,val}2017/``, ``ROOT/coco/annotations/instances_*.json``, all 80
categories listed) or, with ``categories``, a custom set as labelling tools export it. Polygons
of shapes that never overlap, so every mask is exact."""
import json
import math
import os

import numpy as np
from PIL import Image, ImageDraw

from . import dataset_parser, parse_dataset_args, regular_polygon

SHAPES = {"circle": 37, "square": 72, "triangle": 38}  # COCO ids: sports ball, tv, kite


def coco_categories():
    """COCO's 80 thing categories with their official ids (detectron2's metadata table)."""
    from detectron2.data.datasets.builtin_meta import COCO_CATEGORIES

    return [{"id": c["id"], "name": c["name"], "supercategory": "thing"} for c in COCO_CATEGORIES if c["isthing"]]


def shape_polygon(kind, cx, cy, r, angle):
    """The outline of a circle (24 points), square or triangle of radius ``r``, turned by ``angle``."""
    if kind == "circle":
        return regular_polygon(cx, cy, r, 24)
    return regular_polygon(cx, cy, r, 4 if kind == "square" else 3, angle)


def polygon_area(points):
    xs, ys = np.array(points).T
    return float(0.5 * abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))))


def make_image(rng, size, max_shapes, category_ids=SHAPES):
    """(PIL image, COCO annotations without ids) of one image of ``size`` (H, W) holding 1 to
    ``max_shapes`` shapes, labelled ``category_ids[shape]``."""
    h, w = size
    background = rng.integers(0, 80, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
    image = Image.fromarray(np.kron(background, np.ones((8, 8, 1), dtype=np.uint8))[:h, :w])
    draw = ImageDraw.Draw(image)
    anns, placed = [], []
    for _ in range(int(rng.integers(1, max_shapes + 1))):
        kind = list(SHAPES)[int(rng.integers(len(SHAPES)))]
        r = float(rng.uniform(0.08, 0.2) * min(h, w))
        for _attempt in range(20):  # avoid overlaps so that every mask is exact
            cx, cy = float(rng.uniform(r, w - r)), float(rng.uniform(r, h - r))
            if all(math.hypot(cx - px, cy - py) > r + pr + 2 for px, py, pr in placed):
                break
        else:
            continue
        placed.append((cx, cy, r))
        points = shape_polygon(kind, cx, cy, r, float(rng.uniform(0, math.pi)))
        color = tuple(int(c) for c in rng.integers(120, 256, size=3))
        draw.polygon(points, fill=color)
        xs, ys = zip(*points)
        x0, y0 = max(min(xs), 0.0), max(min(ys), 0.0)
        x1, y1 = min(max(xs), w - 1.0), min(max(ys), h - 1.0)
        anns.append(dict(category_id=category_ids[kind], segmentation=[[round(v, 2) for p in points for v in p]],
                         bbox=[round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                         area=round(polygon_area(points), 2), iscrowd=0))
    return image, anns


def write_split(root, split, count, size, max_shapes, seed, categories=None):
    """One split in COCO's layout, or with ``categories`` (names of the shapes' classes) in a
    custom dataset's: (annotation file, images, instances)."""
    rng = np.random.default_rng(seed)
    image_dir = os.path.join(root, split) if categories else os.path.join(root, "coco", f"{split}2017")
    os.makedirs(image_dir, exist_ok=True)
    ids = {kind: i + 1 for i, kind in enumerate(list(SHAPES)[:len(categories)])} if categories else SHAPES
    images, annotations = [], []
    for i in range(count):
        image, anns = make_image(rng, size, max_shapes, ids)
        name = f"{i:012d}.jpg"
        image.save(os.path.join(image_dir, name), quality=95)
        images.append(dict(id=i + 1, file_name=name, height=size[0], width=size[1]))
        for ann in anns:
            annotations.append(dict(ann, id=len(annotations) + 1, image_id=i + 1))
    ann_dir = os.path.join(root, "annotations") if categories else os.path.join(root, "coco", "annotations")
    os.makedirs(ann_dir, exist_ok=True)
    path = os.path.join(ann_dir, f"{split}.json" if categories else f"instances_{split}2017.json")
    listed = [dict(id=i + 1, name=name, supercategory="shape") for i, name in enumerate(categories)] \
        if categories else coco_categories()
    with open(path, "w") as f:
        json.dump(dict(info=dict(description="srvit-backbones synthetic shapes"), licenses=[], images=images,
                       annotations=annotations, categories=listed), f)
    return path, len(images), len(annotations)


def parse_args(argv=None, description=None, custom_categories=True):
    """The options of make_synthetic_coco.py (``--categories`` with ``custom_categories``) and of
    make_synthetic_lvis.py."""
    parser = dataset_parser(description, "DETECTRON2_DATASETS folder to write into", 64, 16, (256, 320))
    if custom_categories:
        parser.add_argument("--categories", nargs="+", metavar="NAME",
                            help=f"a custom dataset: up to {len(SHAPES)} class names for the shapes")
    args = parse_dataset_args(parser, argv)
    if len(getattr(args, "categories", None) or ()) > len(SHAPES):
        parser.error(f"--categories: at most {len(SHAPES)} names (one per shape)")
    return args


def splits(args):
    """(split, number of images, seed) of the two splits."""
    return (("train", args.train, args.seed), ("val", args.val, args.seed + 1))


def write_splits(args):
    """Both splits of ``parse_args``'s ``args``, one at a time: (annotation file, images, instances)."""
    for split, count, seed in splits(args):
        yield write_split(args.root, split, count, tuple(args.size), args.max_shapes, seed, args.categories)
