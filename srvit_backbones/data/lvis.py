"""LVIS without a framework import: the LVIS configs' check of their annotation files (a COCO file
would fail only at the first evaluation), the federated loss's class weights, and lvis's
evaluation under numpy 2 (``lvis_under_numpy2``). LVIS v1's ~1 GB training file is read once per
process, keeping only what these need; the loss's default weights ship in the package.
"""
import contextlib
import functools
import json
import os
import types
from typing import NamedTuple

import numpy

from ..errors import DataCheckError

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


def lvis_summary(path: str) -> LVISSummary:
    """The parts of an LVIS (or COCO) annotation file that the check and the federated loss read,
    parsed once per process and file version (path, size, modification time)."""
    stat = os.stat(path)
    return _summary(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _summary(path, size, mtime_ns) -> LVISSummary:
    """One json parse that drops each annotation (it has ``image_id``) and every image but the first
    as soon as it is read, so that the peak memory is the file's text, not the parsed tree."""
    first_image = []

    def keep(pairs):
        obj = dict(pairs)
        is_image = "coco_url" in obj or "file_name" in obj
        if "image_id" in obj or is_image and first_image:
            return None
        if is_image:
            first_image.append(obj)
        return obj

    with open(path) as f:
        data = json.load(f, object_pairs_hook=keep)
    if not isinstance(data, dict):
        raise LVISFormatError(f"{path!r} is not an annotation file (a json object with categories, images and "
                              f"annotations): {FIX}")
    return LVISSummary(list(data.get("categories") or []), first_image[0] if first_image else None)


def check_lvis_annotations(path: str, what: str = "annotation file") -> None:
    """Check that ``path`` is an LVIS v1 file: categories with ``frequency`` and ``image_count``,
    images with ``coco_url``.

    Raises:
        LVISFormatError: it is missing or not LVIS-format (the message names the field and the fix).
    """
    if not os.path.isfile(path):
        raise LVISFormatError(f"{what} {path!r} does not exist: {FIX}")
    summary = lvis_summary(path)
    categories = summary.categories
    if not categories:
        raise LVISFormatError(f"{what} {path!r} lists no categories: {FIX}")
    for field, kind, why in (
            ("frequency", "LVIS", "the 'frequency' field (r/c/f) that LVIS's evaluation groups its AP by (APr / APc "
                                  "/ APf); a COCO file?"),
            ("image_count", "LVIS v1", "the 'image_count' field (the number of images showing the category, which "
                                       "every LVIS v1 file carries and the federated loss weighs its classes by "
                                       "when given this file);")):
        missing = [c for c in categories if field not in c]
        if missing:
            example = f"({missing[0].get('name')!r}, id {missing[0].get('id')})"
            raise LVISFormatError(f"{what} {path!r} is not {kind}-format: {len(missing)} of its {len(categories)} "
                                  f"categories {example} lack {why} {FIX}")
    if summary.first_image is not None and "coco_url" not in summary.first_image:
        raise LVISFormatError(f"{what} {path!r} is not LVIS-format: its images lack 'coco_url', from which LVIS v1 "
                              f"finds the image file; {FIX}")


def class_image_counts(image_counts: str, num_classes: int) -> list:
    """The federated loss's per-class image counts, in category-id order.

    Args:
        image_counts: ``"lvis_v1"`` (LVIS v1's training counts, shipped) or an LVIS-format training file.
        num_classes: the loss's class count.

    Raises:
        LVISFormatError: not an LVIS file, or not ``num_classes`` counts.
    """
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
    """While active, lvis.eval (and only it) sees a numpy with ``float``: lvis 0.5.3 uses
    ``np.float``, gone since numpy 1.24. Our LVIS evaluators evaluate inside it."""
    import lvis.eval as lvis_eval

    previous = lvis_eval.np
    if not hasattr(numpy, "float"):
        lvis_eval.np = _NumpyWithFloat("numpy")
    try:
        yield
    finally:
        lvis_eval.np = previous
