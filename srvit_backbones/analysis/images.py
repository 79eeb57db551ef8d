"""The images the tools read: which files ``--input`` names, and an image as the backbone takes it."""
import glob
import os
from typing import List, Optional, Sequence

import numpy as np
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from ..errors import InputError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def find_images(inputs: Sequence[str], recursive: bool = True) -> List[str]:
    """Sorted absolute paths of the images that ``inputs`` name: files, folders' images (subfolders
    too when ``recursive``), glob patterns' images.

    Raises:
        InputError: an input does not exist, or none is an image."""
    found = []
    for item in inputs:
        if os.path.isfile(item):
            found.append(item)
            continue
        if os.path.isdir(item):
            listed = ([os.path.join(folder, name) for folder, _, names in os.walk(item) for name in names]
                      if recursive else [entry.path for entry in os.scandir(item) if entry.is_file()])
        elif glob.has_magic(item):
            listed = [p for p in glob.glob(item, recursive=True) if os.path.isfile(p)]
        else:
            raise InputError(f"--input {item!r} does not exist: give image files, folders of images or globs")
        found += [p for p in listed if p.lower().endswith(IMAGE_EXTENSIONS)]
    found = sorted(set(os.path.abspath(p) for p in found))
    if not found:
        raise InputError(f"no images found in --input {' '.join(inputs)} (looked for files ending in "
                         f"{', '.join(IMAGE_EXTENSIONS)})")
    return found


def load_image(path: Optional[str], size: int, keep_aspect: bool = False, patch: int = 16) -> np.ndarray:
    """RGB uint8 (H, W, 3) resized to size x size, or with ``keep_aspect`` the short side to ``size``
    and the long side to a multiple of ``patch``. ``path`` None: scikit-image's astronaut photo."""
    if path is None:
        from skimage import data

        image = Image.fromarray(data.astronaut())
    else:
        image = Image.open(path).convert("RGB")
    width, height = size, size
    if keep_aspect:
        long = max(patch, round(size * max(image.size) / min(image.size) / patch) * patch)
        width, height = (long, size) if image.width >= image.height else (size, long)
    return np.array(image.resize((width, height), Image.BICUBIC))


def to_batch(image: np.ndarray) -> torch.Tensor:
    """(1, 3, H, W) of an RGB uint8 image, ImageNet-normalised as in pretraining."""
    x = torch.from_numpy(image).permute(2, 0, 1).float().div(255)
    mean, std = torch.tensor(IMAGENET_DEFAULT_MEAN), torch.tensor(IMAGENET_DEFAULT_STD)
    return ((x - mean[:, None, None]) / std[:, None, None])[None]
