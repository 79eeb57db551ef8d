"""Synthetic files for the measurements that read them (the adapters build their batches in memory)."""
import os

import torch


def synthetic_image_folder(root, classes=2, images=2, size=64):
    """An ImageFolder of noise, ``root/SPLIT/classC/I.jpg``, as tools/pretrain.py reads ImageNet."""
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for c in range(classes):
            os.makedirs(os.path.join(root, split, f"class{c}"))
            for i in range(images):
                pixels = torch.randint(0, 256, (size, size, 3), dtype=torch.uint8, generator=g).numpy()
                Image.fromarray(pixels).save(os.path.join(root, split, f"class{c}", f"{i}.jpg"))
    return root
