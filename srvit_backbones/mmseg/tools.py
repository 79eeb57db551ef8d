"""Helpers shared by tools/train_seg.py and tools/test_seg.py (mmseg's own scripts' logic)."""
import os
import os.path as osp

import torch
from mmengine.config import Config

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


def load_config(args) -> Config:
    """The config with ``--launcher``, ``--cfg-options`` and ``--work-dir`` applied, as
    mmseg's tools/train.py and tools/test.py do."""
    if "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
    cfg = Config.fromfile(resolve_config(args.config))
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get("work_dir", None) is None:
        cfg.work_dir = osp.join("./work_dirs", osp.splitext(osp.basename(args.config))[0])
    return cfg
