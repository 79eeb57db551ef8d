"""A posterize for timm's RandAugment that accepts every bit count its level functions produce.

timm's ``PosterizeIncreasing`` (our default ``rand-m9-mstd0.5-inc1``) asks for 0 bits when the
sampled magnitude reaches 10, and ``Posterize`` does at magnitudes below 2.5; Pillow >= 13's
``ImageOps.posterize`` rejects 0 bits with ``ValueError``, which would kill a data-loader worker
a few times per thousand images. Older Pillow kept 0 bits, i.e. masked every value to 0; this op
does the same and leaves every other bit count to timm's own posterize (Pillow for 1..7,
unchanged for >= 8). ``guarded_posterize()`` puts it into timm's name->op table, which
``AugmentOp`` reads when a transform is built, while our loaders build theirs
(``engine.build_loaders``); timm's table is as it was after, for anyone else's transforms.
"""
import contextlib

from PIL import Image
from timm.data import auto_augment

_TIMM_POSTERIZE = auto_augment.posterize
POSTERIZE_OPS = ("Posterize", "PosterizeIncreasing", "PosterizeOriginal")


def posterize(img: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize, extended to ``bits_to_keep <= 0``: no bit kept, every value 0 (L/RGB)."""
    if bits_to_keep <= 0:
        return img.point([0] * 256 * len(img.getbands()))
    return _TIMM_POSTERIZE(img, bits_to_keep, **kwargs)


@contextlib.contextmanager
def guarded_posterize():
    """While active, timm's posterize op names give the guarded ``posterize``: the RandAugment
    transforms built inside keep it. Timm's table is restored after."""
    saved = {name: auto_augment.NAME_TO_OP[name] for name in POSTERIZE_OPS}
    auto_augment.NAME_TO_OP.update(dict.fromkeys(POSTERIZE_OPS, posterize))
    try:
        yield
    finally:
        auto_augment.NAME_TO_OP.update(saved)
