"""Helpers shared by tools/train_seg.py and tools/test_seg.py."""
import os

import torch

from ..config_files import config_path, list_configs


def resolve_config(path: str) -> str:
    """A config path, or the name of a shipped config (``upernet_srvit_s.py``)."""
    if os.path.isfile(path):
        return path
    packaged = config_path("mmseg", path)
    if packaged is None:
        raise SystemExit(f"config {path!r} not found (neither a file nor a shipped config; shipped: "
                         f"{', '.join(list_configs('mmseg'))})")
    return packaged


def check_amp():
    if not torch.cuda.is_available():
        raise SystemExit("--amp needs a GPU (mmengine's AmpOptimWrapper); drop --amp to train on the CPU")
