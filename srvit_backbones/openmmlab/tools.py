"""What tools/train_seg.py, test_seg.py, train_det.py and test_det.py share: the config with the command
line applied, a check of the datasets' files before the Runner is built, and a run's fault handling."""
import logging
import os
import os.path as osp
from typing import Callable, Iterable, Optional

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.device import get_device
from mmengine.logging import print_log
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from ..config_files import resolve_config
from ..errors import ConfigError, DataCheckError
from ..training.faults import COLLECTIVE_TIMEOUT_S, collective_timeout

#: the arguments only mixed precision takes (mmengine's ``AmpOptimWrapper``'s)
AMP_ONLY_KEYS = ("loss_scale", "dtype", "use_fsdp")
#: the devices mmengine's ``AmpOptimWrapper`` trains on (it asserts one of them)
AMP_DEVICES = ("cuda", "npu", "mlu", "musa")


def optim_wrapper_class(optim_wrapper):
    """The class an ``optim_wrapper`` config's ``type`` names, or None where no registry knows it."""
    kind = optim_wrapper.get("type", "OptimWrapper")
    kind = OPTIM_WRAPPERS.get(kind) if isinstance(kind, str) else kind
    return kind if isinstance(kind, type) else None


def amp_without_gpu(optim_wrapper) -> Optional[str]:
    """Why an ``optim_wrapper`` config cannot train here: mmengine's ``AmpOptimWrapper`` without a GPU (which
    mmengine asserts without naming the fix); else None."""
    device = get_device()
    if optim_wrapper_class(optim_wrapper) is not AmpOptimWrapper or device in AMP_DEVICES:
        return None
    return f"mixed precision (mmengine's AmpOptimWrapper) needs a GPU, and this run's device is {device!r}"


def apply_amp(cfg: Config, requested: bool) -> None:
    """``--amp``: ``AmpOptimWrapper`` with a dynamic loss scale, as mmseg's and mmdet's tools/train.py do.

    Raises:
        ConfigError: mixed precision (asked by ``--amp`` or the config) without a GPU, naming the fix.
    """
    kind = optim_wrapper_class(cfg.optim_wrapper)
    switched = requested and not (kind and issubclass(kind, AmpOptimWrapper))  # --amp made it AmpOptimWrapper
    if switched:
        cfg.optim_wrapper.type = "AmpOptimWrapper"
        cfg.optim_wrapper.loss_scale = "dynamic"
    why = amp_without_gpu(cfg.optim_wrapper)
    if why:
        raise ConfigError(why + (": drop --amp to train in fp32" if switched else
                                 ": train in fp32, --cfg-options optim_wrapper.type=OptimWrapper"
                                 + (", and drop --amp" if requested else "")))


def check_compile(cfg: Config) -> None:
    """Refuse mmengine's whole-model ``compile`` with a ``paramwise_cfg`` (dynamo fails on mmengine's
    ``ConfigDict`` parameter groups): a ``ConfigError`` naming the backbone's ``compile`` instead."""
    if cfg.get("compile") and cfg.optim_wrapper.get("paramwise_cfg") is not None:
        raise ConfigError(f"compile={cfg.compile!r} is mmengine's whole-model compile (the Runner's train_step, "
                          "optimizer step included), which fails with this config's optim_wrapper.paramwise_cfg "
                          "(torch's dynamo cannot trace the ConfigDict parameter groups mmengine makes of it); "
                          "compile the backbone instead: drop compile and set model.backbone.compile=True "
                          "(--cfg-options model.backbone.compile=True)")


def load_config(args, framework: str, custom_data: Optional[Callable[[Config], None]] = None) -> Config:
    """The config with ``custom_data`` (your own dataset), then ``--cfg-options``, ``--launcher`` and
    ``--work-dir`` applied; a ``ConfigError`` when it is not found."""
    if "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
    try:
        path = resolve_config(framework, args.config)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
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


def prepare_training(cfg: Config) -> None:
    """A run's config made to survive faults (docs/faults.md): ``SRViTCheckpointHook``,
    ``prepare_optim_wrapper``, ``DivergenceCheckHook``, the collective timeout, ``init_cpu_distributed``."""
    checkpoint = (cfg.get("default_hooks") or {}).get("checkpoint")
    if checkpoint and checkpoint.get("type") == "CheckpointHook":
        checkpoint["type"] = "SRViTCheckpointHook"
    prepare_optim_wrapper(cfg)
    hooks = list(cfg.get("custom_hooks") or [])  # mmengine also takes None or a tuple
    if not any(hook.get("type") == "DivergenceCheckHook" for hook in hooks):
        hooks.append(dict(type="DivergenceCheckHook"))
    cfg.custom_hooks = hooks
    if cfg.get("env_cfg") is not None:
        cfg.env_cfg.setdefault("dist_cfg", dict(backend="nccl")).setdefault("timeout", COLLECTIVE_TIMEOUT_S)
    init_cpu_distributed(cfg)


def prepare_optim_wrapper(cfg: Config) -> None:
    """mmengine's fp32 ``OptimWrapper`` made to drop, with a warning, the keys only mixed precision
    takes (on which it would fail)."""
    optim_wrapper = cfg.get("optim_wrapper")
    if not optim_wrapper or optim_wrapper_class(optim_wrapper) is not OptimWrapper:
        return
    dropped = [key for key in AMP_ONLY_KEYS if key in optim_wrapper]
    for key in dropped:
        optim_wrapper.pop(key)
    if dropped:
        print_log(f"optim_wrapper.type={optim_wrapper['type']!r} trains in fp32: the mixed-precision keys "
                  f"{', '.join(f'optim_wrapper.{key}' for key in dropped)} are dropped", logger="current",
                  level=logging.WARNING)


def init_cpu_distributed(cfg: Config) -> None:
    """``--launcher pytorch`` without a GPU (mmengine's ``init_dist`` needs CUDA): the gloo process group
    started before the Runner, DDP without ``device_ids``; a ``ConfigError`` for other launchers or backends."""
    if cfg.launcher == "none" or torch.cuda.is_available():
        return
    dist_cfg = (cfg.get("env_cfg") or {}).get("dist_cfg") or {}
    if cfg.launcher != "pytorch":
        raise ConfigError(f"--launcher {cfg.launcher} on a machine without a GPU: mmengine's {cfg.launcher} launcher "
                          f"needs CUDA; start the processes with torchrun and --launcher pytorch (with "
                          f"--cfg-options env_cfg.dist_cfg.backend=gloo)")
    if dist_cfg.get("backend", "nccl") != "gloo":
        raise ConfigError(f"env_cfg.dist_cfg.backend={dist_cfg.get('backend', 'nccl')!r} needs GPUs; this machine has "
                          f"none: add --cfg-options env_cfg.dist_cfg.backend=gloo to train on the CPU")
    if not dist.is_initialized():  # a second Runner of the process (a test after training) uses the same group
        dist.init_process_group("gloo", timeout=collective_timeout(dist_cfg.get("timeout")))
    wrapper = cfg.get("model_wrapper_cfg") or dict(
        type="MMDistributedDataParallel", broadcast_buffers=False,
        find_unused_parameters=cfg.get("find_unused_parameters", False))
    wrapper["device_ids"] = None
    cfg.model_wrapper_cfg = wrapper


def datasets(dataset, where):
    """(config path, dataset dict) of a dataset config and of those inside its wrappers."""
    if not isinstance(dataset, dict):
        return
    yield where, dataset
    yield from datasets(dataset.get("dataset"), where + ".dataset")
    for i, inner in enumerate(dataset.get("datasets") or ()):
        yield from datasets(inner, f"{where}.datasets.{i}")


def dataset_files(dataset):
    """(key, path, is_folder) of every file a dataset config names, below ``data_root``."""
    root = dataset.get("data_root") or ""
    for key, folder in (dataset.get("data_prefix") or {}).items():
        if isinstance(folder, str):
            yield f"data_prefix.{key}", os.path.join(root, folder), True
    if dataset.get("ann_file"):
        yield "ann_file", os.path.join(root, dataset["ann_file"]), False


def check_data(cfg: Config, loaders: Iterable[str], explain: Callable[[Config, str, dict, str, str], str]) -> None:
    """Before the Runner is built (mmseg and mmdet end in a bare FileNotFoundError otherwise): a
    ``DataCheckError`` saying ``explain(cfg, where, dataset, key, path)`` for a missing path."""
    for loader in loaders:
        if not cfg.get(loader):
            continue
        for where, dataset in datasets(cfg[loader].get("dataset"), loader + ".dataset"):
            if dataset.get("backend_args"):  # files behind a storage backend: not ours to check
                continue
            for key, path, folder in dataset_files(dataset):
                if not (os.path.isdir(path) if folder else os.path.isfile(path)):
                    raise DataCheckError(explain(cfg, where, dataset, key, path))


def expected_layout(cfg: Config) -> str:
    """Every file the config's datasets name, below DATA_ROOT."""
    root = lambda d, p: os.path.join("DATA_ROOT", os.path.relpath(p, d.get("data_root") or "."))  # noqa: E731
    return ", ".join(sorted({root(d, path) for loader in ("train_dataloader", "val_dataloader", "test_dataloader")
                             if cfg.get(loader) for _, d in datasets(cfg[loader].get("dataset"), "")
                             for _, path, _ in dataset_files(d)}))


def missing_path(where: str, dataset: dict, key: str, path: str) -> str:
    """The first line of every missing-data message."""
    cwd = "" if os.path.isabs(path) else f", relative to the current directory {os.getcwd()!r}"
    named = dataset["ann_file"] if key == "ann_file" else dataset["data_prefix"][key.split(".", 1)[1]]
    return (f"{dataset.get('type', 'dataset')} data not found: {path!r} does not exist "
            f"({where}.data_root={dataset.get('data_root') or ''!r} + {key}={named!r}{cwd}).")


def config_dicts(node, where: str = ""):
    """(config path, dict) of every dict in a config tree, ``node`` first."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from config_dicts(value, f"{where}.{key}")
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from config_dicts(value, f"{where}.{i}")


def sync_bn_to_bn(node) -> None:
    """Every ``SyncBN`` of a config node made ``BN``, in place (SyncBN needs CUDA and a process group)."""
    for _, module in config_dicts(node):
        if module.get("type") == "SyncBN":
            module["type"] = "BN"
