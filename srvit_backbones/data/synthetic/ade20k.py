"""A small segmentation dataset (tools/make_synthetic_ade20k.py) in ADE20K's layout, what mmseg's
``ADE20KDataset`` reads (``ROOT/ade/ADEChallengeData2016/{images,annotations}/{training,validation}/``):
label 0 "other" (ignored with ``reduce_zero_label=True``, a thin border of it), 1 "wall" the
textured background, 2..5 filled shapes whose class sets both the form and the colour. Or a
custom set in the layout of mmseg's custom datasets (``ROOT/{images,labels}/{train,val}/``):
label 0 the background, 1..4 the shapes, 255 the unlabelled border, and ``ROOT/classes.txt``."""
import math
import os

import numpy as np
from PIL import Image, ImageDraw

from . import dataset_parser, parse_dataset_args, regular_polygon

# label -> (shape, colour); labels index ADE20K's 150 classes (1 = wall, 2 = building, ...)
CLASSES = {2: ("circle", (220, 60, 60)), 3: ("square", (60, 200, 70)), 4: ("triangle", (70, 90, 230)),
           5: ("diamond", (230, 200, 40))}
IGNORE_LABEL = 0  # ADE20K's "other": reduce_zero_label maps it to 255
BACKGROUND_COLOUR = (60, 60, 60)  # the custom set's class file


def polygon(kind, cx, cy, r):
    """The outline of a circle (32 points), square, triangle or diamond of radius ``r``."""
    sides, phase = {"circle": (32, 0.0), "square": (4, math.pi / 4), "triangle": (3, -math.pi / 2),
                    "diamond": (4, 0.0)}[kind]
    return regular_polygon(cx, cy, r, sides, phase)


def make_sample(rng, size, max_shapes, custom=False):
    """(image, label map) of one sample of ``size`` (H, W), ADE20K's labels or the custom set's."""
    h, w = size
    noise = rng.integers(40, 90, size=(h, w, 3)).astype(np.uint8)
    image = Image.fromarray(noise)
    label = Image.new("L", (w, h), 0 if custom else 1)
    draw_i, draw_l = ImageDraw.Draw(image), ImageDraw.Draw(label)
    for _ in range(int(rng.integers(1, max_shapes + 1))):
        cls = int(rng.choice(list(CLASSES)))
        kind, colour = CLASSES[cls]
        r = float(rng.uniform(0.1, 0.25) * min(h, w))
        cx, cy = float(rng.uniform(r, w - r)), float(rng.uniform(r, h - r))
        pts = polygon(kind, cx, cy, r)
        jitter = tuple(int(np.clip(c + rng.integers(-20, 21), 0, 255)) for c in colour)
        draw_i.polygon(pts, fill=jitter)
        draw_l.polygon(pts, fill=cls - 1 if custom else cls)
    # a thin unlabelled ("other") border, as ADE20K has unlabelled pixels
    draw_l.rectangle([0, 0, w - 1, h - 1], outline=255 if custom else IGNORE_LABEL, width=2)
    return image, label


def write_split(root, split, count, size, max_shapes, seed, custom=False):
    """One split's images and label maps; returns the dataset's folder."""
    rng = np.random.default_rng(seed)
    base = root if custom else os.path.join(root, "ade", "ADEChallengeData2016")
    img_dir = os.path.join(base, "images", split)
    ann_dir = os.path.join(base, "labels" if custom else "annotations", split)
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(ann_dir, exist_ok=True)
    for i in range(count):
        image, label = make_sample(rng, size, max_shapes, custom)
        name = f"{split}_{i:05d}" if custom else f"ADE_{split}_{i:08d}"
        image.save(os.path.join(img_dir, name + ".jpg"), quality=95)
        label.save(os.path.join(ann_dir, name + ".png"))
    return base


def write_dataset(args):
    """Both splits of ``parse_args``'s ``args`` (with ``--classes``, the custom set and its class
    file: a ``NAME R G B`` line per label); returns the dataset's folder."""
    custom = bool(args.classes)
    splits = ("train", "val") if custom else ("training", "validation")
    base = write_split(args.root, splits[0], args.train, tuple(args.size), args.max_shapes, args.seed, custom)
    write_split(args.root, splits[1], args.val, tuple(args.size), args.max_shapes, args.seed + 1, custom)
    if custom:
        colours = [BACKGROUND_COLOUR] + [colour for _, colour in CLASSES.values()]
        with open(os.path.join(base, "classes.txt"), "w") as f:
            f.writelines(f"{name} {r} {g} {b}\n" for name, (r, g, b) in zip(args.classes, colours))
    return base


def parse_args(argv=None, description=None):
    """The options of make_synthetic_ade20k.py."""
    parser = dataset_parser(description, "folder that receives ade/ADEChallengeData2016", 32, 8, (160, 192),
                            count_help=False)
    parser.add_argument("--classes", nargs=len(CLASSES) + 1, metavar="NAME",
                        help="a custom dataset: the names of the background and of the 4 shapes' classes")
    return parse_dataset_args(parser, argv)
