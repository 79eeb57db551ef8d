"""A posterize for timm's RandAugment that accepts 0 bits (Pillow >= 13 rejects them; older Pillow
masked every value to 0, as this does), put into timm's op table while our loaders build theirs."""
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
