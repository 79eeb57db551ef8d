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


def _datasets(dataset, where):
    """(config path, dataset dict) of a dataset config and of those inside its wrappers
    (ConcatDataset's ``datasets``, RepeatDataset's ``dataset``...)."""
    if not isinstance(dataset, dict):
        return
    yield where, dataset
    yield from _datasets(dataset.get("dataset"), where + ".dataset")
    for i, inner in enumerate(dataset.get("datasets") or ()):
        yield from _datasets(inner, f"{where}.datasets.{i}")


def check_data(cfg: Config, loaders) -> None:
    """Stop with the missing folder, the expected layout and the fixes before the Runner is
    built: without this, mmseg ends in a bare FileNotFoundError deep inside its dataset."""
    for loader in loaders:
        if not cfg.get(loader):
            continue
        for where, dataset in _datasets(cfg[loader].get("dataset"), loader + ".dataset"):
            if dataset.get("backend_args"):  # files behind a storage backend: not ours to check
                continue
            prefix = dataset.get("data_prefix") or {}
            for key in ("img_path", "seg_map_path"):
                if key not in prefix:
                    continue
                path = os.path.join(dataset.get("data_root") or "", prefix[key])
                if not os.path.isdir(path):
                    raise SystemExit(_missing_data_message(cfg, where, dataset, key, path))


def _missing_data_message(cfg, where, dataset, key, path) -> str:
    folders = sorted({os.path.join("DATA_ROOT", folder)
                      for loader in ("train_dataloader", "val_dataloader", "test_dataloader") if cfg.get(loader)
                      for _, d in _datasets(cfg[loader].get("dataset"), "")
                      for folder in (d.get("data_prefix") or {}).values()})
    ade = "; for ADE20K, DATA_ROOT is the unpacked ADEChallengeData2016 folder" \
        if dataset.get("type") == "ADE20KDataset" else ""
    cwd = "" if os.path.isabs(path) else f", relative to the current directory {os.getcwd()!r}"
    return (
        f"{dataset.get('type', 'dataset')} data not found: {path!r} does not exist "
        f"({where}.data_root={dataset.get('data_root') or ''!r} + data_prefix.{key}="
        f"{dataset['data_prefix'][key]!r}{cwd}).\n"
        f"Expected layout: {', '.join(folders)}{ade}.\n"
        "Fix: put the dataset there, or point the config at your copy with\n"
        "  --cfg-options train_dataloader.dataset.data_root=DATA_ROOT "
        "val_dataloader.dataset.data_root=DATA_ROOT test_dataloader.dataset.data_root=DATA_ROOT\n"
        "or, to try the tools without ADE20K, generate synthetic data in that layout:\n"
        "  python tools/make_synthetic_ade20k.py --root datasets   "
        "(DATA_ROOT = datasets/ade/ADEChallengeData2016; see make quickstart-mmseg)")
