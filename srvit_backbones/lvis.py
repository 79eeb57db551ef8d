"""The LVIS configs' one check of their annotation files, shared by detectron2's tools/train_net.py
and mmdet's tools/train_det.py / test_det.py, the federated loss's class weights (plain json:
no framework import), and lvis's evaluation under numpy 2 for our evaluators (``lvis_under_numpy2``).

An LVIS config pointed at a COCO-format file would train on COCO's category ids read as LVIS ones
and fail only at its first evaluation (LVIS's evaluation groups categories by ``frequency``, which
COCO files lack): this check fails before anything is built, naming the field and the fix.

LVIS v1's training file is about 1 GB: ``lvis_summary`` reads each file once per process, keeping
only what the check and the loss need (the categories, the first image's fields, the counts of
images and annotations), and the loss's default weights are LVIS v1's counts shipped in the
package (lvis_v1_image_counts.py, as detectron2 ships them), so that a cascade's three losses read
no file at all.
"""
import contextlib
import functools
import json
import os
import types
from typing import NamedTuple

import numpy

from .errors import DataCheckError

FIX = ("an LVIS config needs LVIS v1 annotations (lvis_v1_train.json / lvis_v1_val.json from "
       "https://www.lvisdataset.org/dataset, or tools/make_synthetic_lvis.py); for COCO use the COCO config "
       "it is built on")
LVIS_V1 = "lvis_v1"  # FederatedSigmoidCELoss(image_counts=...): LVIS v1's shipped counts


class LVISFormatError(DataCheckError, ValueError):
    """A file that an LVIS config or loss reads is not LVIS-format; the message names the field and
    the fix."""


class LVISSummary(NamedTuple):
    categories: list  # the file's category dicts, as written
    first_image: dict  # its first image (None without images)
    num_images: int
    num_annotations: int


def lvis_summary(path: str) -> LVISSummary:
    """The parts of an LVIS (or COCO) annotation file that the check and the federated loss read,
    parsed once per process and file version (path, size, modification time)."""
    stat = os.stat(path)
    return _summary(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _summary(path, size, mtime_ns) -> LVISSummary:
    """One json parse that keeps the categories and drops each annotation and every image but the
    first as soon as it is read (objects are told apart by their fields: an annotation has
    ``image_id``, an image ``coco_url`` or ``file_name``), so that the peak memory is the file's
    text and its categories, not the whole parsed tree."""
    counts = dict(images=0, annotations=0)
    first_image = []

    def keep(pairs):
        obj = dict(pairs)
        if "image_id" in obj:
            counts["annotations"] += 1
            return None
        if "coco_url" in obj or "file_name" in obj:
            counts["images"] += 1
            if first_image:
                return None
            first_image.append(obj)
        return obj

    with open(path) as f:
        data = json.load(f, object_pairs_hook=keep)
    if not isinstance(data, dict):
        raise LVISFormatError(f"{path!r} is not an annotation file (a json object with categories, images and "
                              f"annotations): {FIX}")
    return LVISSummary(list(data.get("categories") or []), first_image[0] if first_image else None,
                       counts["images"], counts["annotations"])


def check_lvis_annotations(path: str, what: str = "annotation file") -> None:
    """Raise LVISFormatError when ``path`` is not an LVIS-format file: its categories must carry
    ``frequency`` (r/c/f) and ``image_count``, and its images ``coco_url`` (where LVIS v1 finds the
    image)."""
    if not os.path.isfile(path):
        raise LVISFormatError(f"{what} {path!r} does not exist: {FIX}")
    summary = lvis_summary(path)
    categories = summary.categories
    if not categories:
        raise LVISFormatError(f"{what} {path!r} lists no categories: {FIX}")
    missing = [c for c in categories if "frequency" not in c]
    if missing:
        example = f" ({missing[0].get('name')!r}, id {missing[0].get('id')})"
        raise LVISFormatError(
            f"{what} {path!r} is not LVIS-format: {len(missing)} of its {len(categories)} categories{example} "
            f"lack the 'frequency' field (r/c/f) that LVIS's evaluation groups its AP by (APr / APc / APf); a COCO file? {FIX}")
    missing = [c for c in categories if "image_count" not in c]
    if missing:
        example = f" ({missing[0].get('name')!r}, id {missing[0].get('id')})"
        raise LVISFormatError(
            f"{what} {path!r} is not LVIS v1-format: {len(missing)} of its {len(categories)} categories{example} "
            f"lack the 'image_count' field (the number of images showing the category, which every LVIS v1 file "
            f"carries and the federated loss weighs its classes by when given this file); {FIX}")
    if summary.first_image is not None and "coco_url" not in summary.first_image:
        raise LVISFormatError(f"{what} {path!r} is not LVIS-format: its images lack 'coco_url', from which LVIS v1 "
                              f"finds the image file; {FIX}")


def class_image_counts(image_counts: str, num_classes: int) -> list:
    """The federated loss's per-class image counts, in category-id order: ``"lvis_v1"``, LVIS v1's
    training counts shipped in the package (detectron2's ``LVIS_CATEGORY_IMAGE_COUNT``), or the path
    of an LVIS-format training file (its categories' ``image_count``; read once per process). Raises
    LVISFormatError when they are not ``num_classes`` counts."""
    if image_counts == LVIS_V1:
        from .lvis_v1_image_counts import LVIS_V1_TRAIN_IMAGE_COUNTS

        counts, source = list(LVIS_V1_TRAIN_IMAGE_COUNTS), "LVIS v1's image counts (image_counts='lvis_v1')"
    else:
        check_lvis_annotations(image_counts, "the federated loss's image_counts file")
        categories = sorted(lvis_summary(image_counts).categories, key=lambda c: c["id"])
        counts, source = [int(c["image_count"]) for c in categories], f"image_counts file {image_counts!r}"
    if len(counts) != num_classes:
        raise LVISFormatError(
            f"the federated loss has num_classes={num_classes} but {source} lists {len(counts)} categories: "
            f"for a dataset other than LVIS v1, set the loss's image_counts to its training annotation file "
            f"(LVIS format, with each category's 'image_count')")
    return counts


class _NumpyWithFloat(types.ModuleType):
    """numpy, with the ``np.float`` alias that lvis 0.5.3 uses."""

    float = float

    def __getattr__(self, name):
        return getattr(numpy, name)


@contextlib.contextmanager
def lvis_under_numpy2():
    """While active, lvis.eval (and only it) sees a numpy with ``float``: lvis 0.5.3 (PyPI's
    latest) accumulates its precision with ``np.float``, which numpy removed in 1.24, so with
    numpy 2 ``LVISEval.run()`` raises AttributeError at the end of every LVIS evaluation. Our LVIS
    evaluators (``SRViTLVISEvaluator``, ``SRViTLVISMetric``) evaluate inside it; lvis.eval is
    restored after, for anyone else's evaluation in the process."""
    import lvis.eval as lvis_eval

    previous = lvis_eval.np
    if not hasattr(numpy, "float"):
        lvis_eval.np = _NumpyWithFloat("numpy")
    try:
        yield
    finally:
        lvis_eval.np = previous
