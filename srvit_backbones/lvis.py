"""The LVIS configs' one check of their annotation files, shared by detectron2's tools/train_net.py
and mmdet's tools/train_det.py / test_det.py (plain json: no framework import).

An LVIS config pointed at a COCO-format file would train on COCO's category ids read as LVIS ones
and fail only at its first evaluation (LVIS's evaluation groups categories by ``frequency``, which
COCO files lack): this check fails before anything is built, naming the field and the fix.
"""
import json
import os
import types

import numpy

FIX = ("an LVIS config needs LVIS v1 annotations (lvis_v1_train.json / lvis_v1_val.json from "
       "https://www.lvisdataset.org/dataset, or tools/make_synthetic_lvis.py); for COCO use the COCO config "
       "it is built on")


class LVISFormatError(ValueError):
    pass


def check_lvis_annotations(path: str, what: str = "annotation file") -> None:
    """Raise LVISFormatError when ``path`` is not an LVIS-format file: its categories must carry
    ``frequency`` (r/c/f) and its images ``coco_url`` (where LVIS v1 finds the image)."""
    if not os.path.isfile(path):
        raise LVISFormatError(f"{what} {path!r} does not exist: {FIX}")
    with open(path) as f:
        data = json.load(f)
    categories = data.get("categories") or []
    if not categories:
        raise LVISFormatError(f"{what} {path!r} lists no categories: {FIX}")
    missing = [c for c in categories if "frequency" not in c]
    if missing:
        example = f" ({missing[0].get('name')!r}, id {missing[0].get('id')})"
        raise LVISFormatError(
            f"{what} {path!r} is not LVIS-format: {len(missing)} of its {len(categories)} categories{example} "
            f"lack the 'frequency' field (r/c/f) that LVIS's evaluation groups its AP by (APr / APc / APf); a COCO file? {FIX}")
    images = data.get("images") or []
    if images and "coco_url" not in images[0]:
        raise LVISFormatError(f"{what} {path!r} is not LVIS-format: its images lack 'coco_url', from which LVIS v1 "
                              f"finds the image file; {FIX}")



class _NumpyWithFloat(types.ModuleType):
    """numpy, with the ``np.float`` alias that lvis 0.5.3 uses."""

    float = float

    def __getattr__(self, name):
        return getattr(numpy, name)


def patch_lvis_for_numpy2() -> bool:
    """lvis 0.5.3 (PyPI's latest) accumulates its precision with ``np.float``, which numpy removed in
    1.24: with numpy 2, LVISEval.run() raises AttributeError at the end of every LVIS evaluation
    (detectron2's LVISEvaluator, mmdet's LVISMetric). Give lvis.eval, and only it, a numpy whose
    ``float`` is the builtin (what the alias meant). Returns whether lvis.eval was patched; the
    framework adapters call it when imported."""
    try:
        import lvis.eval as lvis_eval
    except ImportError:
        return False
    if hasattr(numpy, "float") or isinstance(lvis_eval.np, _NumpyWithFloat):
        return False
    lvis_eval.np = _NumpyWithFloat("numpy")
    return True
