"""Helpers shared by tools/train_seg.py and tools/test_seg.py (mmseg's own scripts' logic)."""
import os
import os.path as osp

import torch
from mmengine.config import Config

from ..config_files import resolve_config


def check_amp():
    if not torch.cuda.is_available():
        raise SystemExit("--amp needs a GPU (mmengine's AmpOptimWrapper); drop --amp to train on the CPU")


def load_config(args) -> Config:
    """The config with ``--launcher``, ``--cfg-options`` and ``--work-dir`` applied, as
    mmseg's tools/train.py and tools/test.py do."""
    if "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
    try:
        path = resolve_config("mmseg", args.config)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None
    cfg = Config.fromfile(path)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get("work_dir", None) is None:
        cfg.work_dir = osp.join("./work_dirs", osp.splitext(osp.basename(args.config))[0])
    return cfg
