"""What tools/train_seg.py, test_seg.py, train_det.py and test_det.py share: the config with
the command line applied (as mmseg's and mmdet's own tools/train.py and tools/test.py do), and
a check of the dataset's files before the Runner is built."""
import os
import os.path as osp
from typing import Callable, Iterable, Optional

import torch
from mmengine.config import Config

from ..config_files import resolve_config


def apply_amp(cfg: Config, requested: bool) -> None:
    """``--amp``: train with mmengine's ``AmpOptimWrapper`` (fp16 autocast and a dynamic loss
    scale). It needs CUDA, so ``--amp`` on a machine without a GPU is refused, and so is a
    config that trains with it already, each naming the fix."""
    uses_amp = requested or cfg.optim_wrapper.type == "AmpOptimWrapper"
    if uses_amp and not torch.cuda.is_available():
        if requested:
            raise SystemExit("--amp needs a GPU (mmengine's AmpOptimWrapper); drop --amp to train on the CPU")
        raise SystemExit("this config trains with mixed precision (optim_wrapper.type='AmpOptimWrapper': fp16 "
                         "autocast and a GradScaler), which needs a CUDA GPU; to train in fp32 on the CPU add "
                         "--cfg-options optim_wrapper.type=OptimWrapper")
    if requested and cfg.optim_wrapper.type != "AmpOptimWrapper":
        cfg.optim_wrapper.type = "AmpOptimWrapper"
        cfg.optim_wrapper.loss_scale = "dynamic"


def load_config(args, framework: str, custom_data: Optional[Callable[[Config], None]] = None) -> Config:
    """The config with ``--launcher``, ``--cfg-options`` and ``--work-dir`` applied;
    ``custom_data`` (the tool's options for your own dataset) edits it before ``--cfg-options``."""
    if "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
    try:
        path = resolve_config(framework, args.config)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None
    cfg = Config.fromfile(path)
    cfg.launcher = args.launcher
    if custom_data is not None:
        custom_data(cfg)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get("work_dir", None) is None:
        cfg.work_dir = osp.join("./work_dirs", osp.splitext(osp.basename(args.config))[0])
    return cfg


def datasets(dataset, where):
    """(config path, dataset dict) of a dataset config and of those inside its wrappers
    (ConcatDataset's ``datasets``, RepeatDataset's ``dataset``...)."""
    if not isinstance(dataset, dict):
        return
    yield where, dataset
    yield from datasets(dataset.get("dataset"), where + ".dataset")
    for i, inner in enumerate(dataset.get("datasets") or ()):
        yield from datasets(inner, f"{where}.datasets.{i}")


def dataset_files(dataset):
    """(key, path, is_folder) of every file a dataset config names: its ``data_prefix``
    folders and its ``ann_file``, below ``data_root``."""
    root = dataset.get("data_root") or ""
    for key, folder in (dataset.get("data_prefix") or {}).items():
        if isinstance(folder, str):
            yield f"data_prefix.{key}", os.path.join(root, folder), True
    if dataset.get("ann_file"):
        yield "ann_file", os.path.join(root, dataset["ann_file"]), False


def check_data(cfg: Config, loaders: Iterable[str], explain: Callable[[Config, str, dict, str, str], str]) -> None:
    """Stop with ``explain(cfg, where, dataset, key, path)`` (the missing path, the expected
    layout and the fixes) before the Runner is built: without this, mmseg and mmdet end in a
    bare FileNotFoundError deep inside their datasets."""
    for loader in loaders:
        if not cfg.get(loader):
            continue
        for where, dataset in datasets(cfg[loader].get("dataset"), loader + ".dataset"):
            if dataset.get("backend_args"):  # files behind a storage backend: not ours to check
                continue
            for key, path, folder in dataset_files(dataset):
                if not (os.path.isdir(path) if folder else os.path.isfile(path)):
                    raise SystemExit(explain(cfg, where, dataset, key, path))


def expected_layout(cfg: Config) -> str:
    """Every file the config's datasets name, below DATA_ROOT."""
    root = lambda d, p: os.path.join("DATA_ROOT", os.path.relpath(p, d.get("data_root") or "."))  # noqa: E731
    return ", ".join(sorted({root(d, path) for loader in ("train_dataloader", "val_dataloader", "test_dataloader")
                             if cfg.get(loader) for _, d in datasets(cfg[loader].get("dataset"), "")
                             for _, path, _ in dataset_files(d)}))


def missing_path(where: str, dataset: dict, key: str, path: str) -> str:
    """The first line of every missing-data message: what does not exist and where it came from."""
    cwd = "" if os.path.isabs(path) else f", relative to the current directory {os.getcwd()!r}"
    named = dataset["ann_file"] if key == "ann_file" else dataset["data_prefix"][key.split(".", 1)[1]]
    return (f"{dataset.get('type', 'dataset')} data not found: {path!r} does not exist "
            f"({where}.data_root={dataset.get('data_root') or ''!r} + {key}={named!r}{cwd}).")


def sync_bn_to_bn(node) -> None:
    """Every ``SyncBN`` of a config node made ``BN``, in place: SyncBN needs CUDA and a process
    group, so a CPU run (a check, a test) takes mmseg's plain BN, as mmseg asks of CPU runs."""
    if isinstance(node, dict):
        if node.get("type") == "SyncBN":
            node["type"] = "BN"
        for value in node.values():
            sync_bn_to_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            sync_bn_to_bn(value)
