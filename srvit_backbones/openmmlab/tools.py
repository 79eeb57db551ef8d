"""What tools/train_seg.py, test_seg.py, train_det.py and test_det.py share: the config with
the command line applied (as mmseg's and mmdet's own tools/train.py and tools/test.py do), a
check of the dataset's files before the Runner is built, and a training run's fault handling
(the fault hooks, the collective timeout, ``--launcher pytorch`` on a machine without a GPU)."""
import logging
import os
import os.path as osp
import warnings
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
from ..faults import COLLECTIVE_TIMEOUT_S, collective_timeout
from .optim_wrapper import (MMENGINE_AMP_DEVICES, DeviceAmpOptimWrapper, amp_optim_dtype, cpu_mixed_precision_refusal,
                            device_kind)

#: the arguments only mixed precision takes (mmengine's ``AmpOptimWrapper``'s and ``DeviceAmpOptimWrapper``'s)
AMP_ONLY_KEYS = ("loss_scale", "dtype", "use_fsdp", "device_type", "cpu_refusal")


def optim_wrapper_class(optim_wrapper):
    """The class an ``optim_wrapper`` config's ``type`` names (a name, scoped as
    ``'mmdet.AmpOptimWrapper'`` or not, or the class), or None where no registry knows it."""
    kind = optim_wrapper.get("type", "OptimWrapper")
    kind = OPTIM_WRAPPERS.get(kind) if isinstance(kind, str) else kind
    return kind if isinstance(kind, type) else None


def apply_amp(cfg: Config, requested: bool) -> None:
    """``--amp``: train with ``AmpOptimWrapper`` and a dynamic loss scale, as mmseg's and mmdet's
    own tools/train.py do, where the config does not train in mixed precision already (its own
    loss scale kept). ``prepare_training`` makes ``AmpOptimWrapper`` ``DeviceAmpOptimWrapper``:
    fp16 on CUDA, bf16 on a CPU with native bf16. Mixed precision that cannot run here, asked by
    ``--amp`` or by the config, is refused before anything is built, naming the fix in the terms
    of what asked for it: a model whose framework cannot train it so on a CPU
    (``cpu_mixed_precision_refusal``), a CPU without native bf16 and no dtype named
    (``srvit_backbones.amp``'s rule: never a silent fp32 run, nor emulated bf16, which is slower
    than fp32), a device other than CUDA, the CPU, NPU, MLU or MUSA: a ``ConfigError``."""
    kind = optim_wrapper_class(cfg.optim_wrapper)
    switched = requested and not (kind and issubclass(kind, AmpOptimWrapper))  # --amp made it AmpOptimWrapper
    if switched:
        cfg.optim_wrapper.type = "AmpOptimWrapper"
        cfg.optim_wrapper.loss_scale = "dynamic"
    if optim_wrapper_class(cfg.optim_wrapper) not in (AmpOptimWrapper, DeviceAmpOptimWrapper) \
            or not runs_device_amp(cfg.optim_wrapper):
        return  # fp32, mmengine's own on an NPU, MLU or MUSA device, or a wrapper of the config's own
    device_type = device_kind(cfg.optim_wrapper.get("device_type") or get_device())
    refused = cpu_mixed_precision_refusal(cfg) if device_type == "cpu" else None
    if refused:
        raise ConfigError(refused + (": drop --amp to train in fp32" if switched else
                                     ": train in fp32, --cfg-options optim_wrapper.type=OptimWrapper"
                                     + (", and drop --amp" if requested else "")))
    try:
        with warnings.catch_warnings():  # an emulated dtype: the wrapper warns when it is built
            warnings.simplefilter("ignore")
            amp_optim_dtype(device_type, cfg.optim_wrapper.get("dtype"))
    except ValueError as e:
        message = str(e)
        if switched and device_type not in ("cuda", "cpu"):
            message = (f"--amp trains mixed precision on CUDA and the CPU (and, by mmengine's own AmpOptimWrapper, on "
                       f"NPU, MLU and MUSA), not on this run's {device_type!r} device: drop --amp to train in fp32")
        elif switched and device_type == "cpu" and cfg.optim_wrapper.get("dtype") is None:
            message = ("--amp on the CPU runs bf16, but this CPU has no native bf16 (AVX512-BF16 or AMX), and "
                       "emulated bf16 is slower than fp32: drop --amp to train in fp32, or name the dtype, "
                       "--cfg-options optim_wrapper.dtype=float16, to run the GPU's fp16 path here (loss scaling "
                       "and skipped steps; slower than fp32)")
        elif requested:  # the config's own message, and --amp would make an OptimWrapper AmpOptimWrapper again
            message += " (for fp32 drop --amp too: it makes an OptimWrapper AmpOptimWrapper)"
        raise ConfigError(message) from None


def runs_device_amp(optim_wrapper) -> bool:
    """Whether an ``optim_wrapper`` config runs ``DeviceAmpOptimWrapper``: everywhere but on an
    NPU, MLU or MUSA device (its ``device_type``, else the run's), where an ``AmpOptimWrapper``
    stays mmengine's own, which runs there. On a device that neither runs (MPS...)
    ``DeviceAmpOptimWrapper`` refuses it naming the fix, where mmengine's fails an assert."""
    if optim_wrapper.get("type") == "DeviceAmpOptimWrapper":
        return True
    return device_kind(optim_wrapper.get("device_type") or get_device()) not in MMENGINE_AMP_DEVICES


def check_compile(cfg: Config) -> None:
    """Refuse mmengine's own ``compile`` (the Runner compiles the whole ``train_step``) where it
    cannot work, naming the backbone's switch: with a ``paramwise_cfg`` (every shipped config's,
    for layer decay) mmengine builds the optimizer's parameter groups as ``ConfigDict``s, and
    torch 2.14's dynamo stops in ``AdamW.step`` on them (``InternalTorchDynamoError``), after the
    whole first step has compiled (a ``ConfigError``)."""
    if cfg.get("compile") and cfg.optim_wrapper.get("paramwise_cfg") is not None:
        raise ConfigError(f"compile={cfg.compile!r} is mmengine's whole-model compile (the Runner's train_step, "
                          "optimizer step included), which fails with this config's optim_wrapper.paramwise_cfg "
                          "(torch's dynamo cannot trace the ConfigDict parameter groups mmengine makes of it); "
                          "compile the backbone instead: drop compile and set model.backbone.compile=True "
                          "(--cfg-options model.backbone.compile=True)")


def load_config(args, framework: str, custom_data: Optional[Callable[[Config], None]] = None) -> Config:
    """The config with ``--launcher``, ``--cfg-options`` and ``--work-dir`` applied;
    ``custom_data`` (the tool's options for your own dataset) edits it before ``--cfg-options``;
    a ``ConfigError`` when the config is not found."""
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
    """A run's config (``SRViTRunner`` applies it to training and test runs alike) made to
    survive faults, its mixed precision run on the run's device, and its process group started
    where mmengine cannot: the checkpoint hook made ``SRViTCheckpointHook`` (written whole or not
    at all), ``AmpOptimWrapper`` made ``DeviceAmpOptimWrapper`` (``prepare_optim_wrapper``),
    ``DivergenceCheckHook`` added where a config (a user's own) lacks it, the collective timeout
    ``faults.COLLECTIVE_TIMEOUT_S`` where ``env_cfg.dist_cfg`` sets none, and
    ``init_cpu_distributed``."""
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
    """mmengine's ``AmpOptimWrapper`` (by any name: ``'mmdet.AmpOptimWrapper'``, the class; not a
    config's own subclass) made ``DeviceAmpOptimWrapper`` where that runs (``runs_device_amp``:
    mmengine's on CUDA, and on a CPU by the package's mixed-precision rule), given
    - ``use_fsdp=True`` (a ``ShardedGradScaler``, whose ranks agree on a skipped step) where the
      model is sharded (``shards_with_fsdp``), unless the config sets it: mmengine's
      ``FSDPStrategy`` sets it only on a wrapper named ``AmpOptimWrapper``, and its ``Runner`` with
      ``MMFullyShardedDataParallel`` not at all (its ranks could disagree on skipping a step);
    - ``cpu_refusal``, where the model's framework says it cannot train so on a CPU
      (``cpu_mixed_precision_refusal``): the wrapper refuses it there when a training run builds it.
    mmengine's plain ``OptimWrapper`` (fp32, the fix the messages name: ``--cfg-options
    optim_wrapper.type=OptimWrapper``, which cannot delete keys) drops the keys only mixed
    precision takes, with a warning naming them, where it would fail on them (``unexpected
    keyword argument``)."""
    optim_wrapper = cfg.get("optim_wrapper")
    if not optim_wrapper:
        return
    kind = optim_wrapper_class(optim_wrapper)
    if kind is AmpOptimWrapper and runs_device_amp(optim_wrapper):  # mmengine's by any name, not a subclass
        optim_wrapper["type"] = "DeviceAmpOptimWrapper"
        kind = DeviceAmpOptimWrapper
    if kind is DeviceAmpOptimWrapper:
        if shards_with_fsdp(cfg):
            optim_wrapper.setdefault("use_fsdp", True)
        refused = cpu_mixed_precision_refusal(cfg)
        if refused:  # the wrapper refuses it on a CPU when it is built (training runs only)
            optim_wrapper.setdefault("cpu_refusal", refused)
    if kind is OptimWrapper:
        dropped = [key for key in AMP_ONLY_KEYS if key in optim_wrapper]
        for key in dropped:
            optim_wrapper.pop(key)
        if dropped:
            print_log(f"optim_wrapper.type={optim_wrapper['type']!r} trains in fp32: the mixed-precision keys "
                      f"{', '.join(f'optim_wrapper.{key}' for key in dropped)} are dropped", logger="current",
                      level=logging.WARNING)


def shards_with_fsdp(cfg: Config) -> bool:
    """Whether the run shards its model with FSDP: a ``FlexibleRunner``'s ``strategy`` that is
    mmengine's ``FSDPStrategy`` (by name, class or object; a subclass too), or a ``Runner``'s
    ``model_wrapper_cfg`` that is torch's ``FullyShardedDataParallel`` (mmengine's
    ``MMFullyShardedDataParallel``)."""
    strategy, wrapper = cfg.get("strategy"), cfg.get("model_wrapper_cfg")
    if not strategy and not wrapper:
        return False
    try:
        from mmengine._strategy import FSDPStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # a torch (or mmengine) without FSDP shards nothing
        return False
    from mmengine.registry import MODEL_WRAPPERS, STRATEGIES

    return isinstance(strategy, FSDPStrategy) or _names_a_subclass(strategy, STRATEGIES, FSDPStrategy) or \
        _names_a_subclass(wrapper, MODEL_WRAPPERS, FullyShardedDataParallel)


def _names_a_subclass(node, registry, base) -> bool:
    """Whether a config node, ``dict(type=...)``, names ``base`` or a subclass of it (by its name in
    ``registry`` or the class)."""
    kind = node.get("type") if isinstance(node, dict) else None
    kind = registry.get(kind) if isinstance(kind, str) else kind
    return isinstance(kind, type) and issubclass(kind, base)


def init_cpu_distributed(cfg: Config) -> None:
    """``--launcher pytorch`` (torchrun, one machine or many) on machines without a GPU:
    mmengine's ``init_dist`` calls ``torch.cuda.set_device`` and fails there, and its DDP wrapper
    passes a GPU index as ``device_ids``. Here the gloo process group is started before the
    Runner (which then uses it) and DDP wraps the CPU model without ``device_ids``. A
    ``ConfigError`` for another launcher, or a backend other than gloo, there."""
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
    """A ``DataCheckError`` saying ``explain(cfg, where, dataset, key, path)`` (the missing path,
    the expected layout and the fixes) before the Runner is built: without this, mmseg and mmdet
    end in a bare FileNotFoundError deep inside their datasets."""
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
