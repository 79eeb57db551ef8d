"""``DeviceAmpOptimWrapper``: mmengine's ``AmpOptimWrapper`` on the run's device type, CUDA or
CPU, by the package's one mixed-precision rule (``srvit_backbones.amp``). ``prepare_training``
(and so ``SRViTRunner``, ``mim train`` included) makes every config's ``AmpOptimWrapper`` this
one; it is registered in mmengine's root ``OPTIM_WRAPPERS``, which mmseg's and mmdet's registries
fall back to."""
from contextlib import contextmanager
from numbers import Real
from typing import Any, Callable, Dict, Optional, Union

import torch
import torch.nn as nn
from mmengine.device import get_device
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from .. import amp

#: the devices mmengine's own ``AmpOptimWrapper`` runs on and ours does not (it also runs on CUDA)
MMENGINE_AMP_DEVICES = ("npu", "mlu", "musa")
#: Why a framework's models cannot train in mixed precision on a CPU: by its configs' ``default_scope``,
#: a function of the config that names the reason (None where its model can). The framework's
#: package fills it in on import (``srvit_backbones.mmdet``: two-stage detectors, mmcv's CPU nms).
#: ``tools.apply_amp`` refuses such a run before anything is built; ``tools.prepare_optim_wrapper``
#: hands the reason to ``DeviceAmpOptimWrapper`` (``cpu_refusal``), which refuses it when a training
#: run builds it (mmseg's and mmdet's own tools/train.py too).
CPU_MIXED_PRECISION_REFUSALS: Dict[str, Callable[[Any], Optional[str]]] = {}
#: an ``AmpOptimWrapper`` ``dtype`` (mmengine's names; torch dtypes too) as ``srvit_backbones.amp``'s ``--amp`` value
PRECISION_OF_DTYPE = {None: "auto", "float16": "fp16", "bfloat16": "bf16"}


def device_kind(device: Union[str, torch.device]) -> str:
    """The type of ``device`` ('cuda:1' -> 'cuda'), also of a device torch knows only with its
    plugin installed ('npu' needs torch_npu for ``torch.device``)."""
    return str(device).split(":")[0]


def cpu_mixed_precision_refusal(cfg) -> Optional[str]:
    """Why the model of ``cfg`` (an mmengine config) cannot train in mixed precision on a CPU, as
    its framework says (``CPU_MIXED_PRECISION_REFUSALS``, by the config's ``default_scope``);
    None where it can."""
    scope = cfg.get("default_scope")
    refusal = CPU_MIXED_PRECISION_REFUSALS.get(scope)
    why = refusal(cfg) if refusal is not None else None
    return f"mixed precision on the CPU cannot train this {scope} model: {why}" if why else None


def amp_optim_dtype(device_type: str, dtype: Union[None, str, torch.dtype]) -> torch.dtype:
    """The autocast dtype of an ``AmpOptimWrapper`` with ``dtype`` on ``device_type``
    (``srvit_backbones.amp.resolve_precision``: None is ``auto``, fp16 on CUDA and bf16 on a
    CPU with native bf16), or a ValueError in the config's terms naming the fix."""
    name = str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else dtype
    if name not in PRECISION_OF_DTYPE:
        raise ValueError(f"optim_wrapper.dtype={name!r}: mixed precision runs 'float16' or 'bfloat16' (None: fp16 on "
                         f"CUDA, bf16 on a CPU with native bf16); to train in fp32 set optim_wrapper.type=OptimWrapper")
    kind = device_kind(device_type)
    if kind in MMENGINE_AMP_DEVICES:
        raise ValueError(f"DeviceAmpOptimWrapper runs on 'cuda' and 'cpu' devices, this run's is {kind!r}: name "
                         f"mmengine's own for it, optim_wrapper.type='mmengine.AmpOptimWrapper'")
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"mixed precision (AmpOptimWrapper) runs on CUDA and the CPU, and by mmengine's own on "
                         f"{', '.join(MMENGINE_AMP_DEVICES)}, not on this run's {kind!r} device: train in fp32 "
                         f"(--cfg-options optim_wrapper.type=OptimWrapper)")
    if kind == "cpu" and name is None and not amp.cpu_has_native_bf16():
        raise ValueError("optim_wrapper.type='AmpOptimWrapper' without a dtype (as --amp) runs bf16 on the CPU, but "
                         "this CPU has no native bf16 (AVX512-BF16 or AMX), and emulated bf16 is slower than fp32: "
                         "train in fp32 (--cfg-options optim_wrapper.type=OptimWrapper), or name the dtype to run "
                         "the GPU's fp16 path here, loss scaling and skipped steps, slower than fp32 (--cfg-options "
                         "optim_wrapper.dtype=float16)")
    return amp.resolve_precision(kind, PRECISION_OF_DTYPE[name])


@OPTIM_WRAPPERS.register_module()  # mmengine's root registry: mmseg's and mmdet's children find it there
class DeviceAmpOptimWrapper(AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` (its backward, step, state_dict and load_state_dict:
    loss scaling, skipped steps and checkpoints) on ``device_type``, the run's device by default
    (``mmengine.device.get_device()``, where the Runner puts the model), passed in to run the
    GPU's fp16 path on a CPU.

    Args: mmengine's (``loss_scale``: 'dynamic', a number (a fixed scale) or a dict of
    ``torch.amp.GradScaler`` arguments; ``dtype``: None, 'float16' or 'bfloat16', or the torch
    dtype; ``use_fsdp``; the ``OptimWrapper``'s), and ``device_type``. ``dtype`` None is the
    device's (``amp_optim_dtype``): fp16 on CUDA, as mmengine's, bf16 on a CPU with native bf16,
    else an error naming the fix. The GradScaler is made for every dtype, as mmengine's, so its
    state (``state_dict()['loss_scaler']``) has mmengine's keys and a checkpoint moves between the
    two classes both ways.

    ``cpu_refusal``: why the run's model cannot train in mixed precision on a CPU
    (``cpu_mixed_precision_refusal``; ``tools.prepare_training`` sets it from the config): on a
    CPU the wrapper is refused, naming it and fp32.

    ``__init__`` repeats mmengine 0.10.7's without what ties it to CUDA: its assert of a GPU (NPU,
    MLU or MUSA) and its ``torch.cuda.amp.GradScaler`` (a ``torch.amp.GradScaler`` of the device
    type here); ``optim_context`` enters ``torch.autocast(device_type, dtype)`` instead of
    ``mmengine.runner.amp.autocast``, which allows only bf16 on the CPU."""

    def __init__(self, loss_scale: Union[str, float, dict] = "dynamic", dtype: Union[None, str, torch.dtype] = None,
                 use_fsdp: bool = False, device_type: Optional[str] = None, cpu_refusal: Optional[str] = None,
                 **kwargs):
        OptimWrapper.__init__(self, **kwargs)  # not AmpOptimWrapper's: it asserts a GPU
        self.device_type = device_kind(device_type or get_device())
        try:
            if cpu_refusal and self.device_type == "cpu":
                raise ValueError(f"{cpu_refusal}: train in fp32 (--cfg-options optim_wrapper.type=OptimWrapper)")
            self.cast_dtype = amp_optim_dtype(self.device_type, dtype)
        except ValueError as e:  # mmseg's and mmdet's tools/train.py set the type after --cfg-options
            if "optim_wrapper.type=OptimWrapper" not in str(e):
                raise
            raise ValueError(f"{e}; with tools/train.py's --amp, drop --amp too (it sets "
                             f"optim_wrapper.type=AmpOptimWrapper after --cfg-options)") from None
        if use_fsdp:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as scaler_type
        else:
            scaler_type = torch.amp.GradScaler
        self._scale_update_param = None
        if loss_scale == "dynamic":
            self.loss_scaler = scaler_type(self.device_type)
        elif isinstance(loss_scale, Real) and not isinstance(loss_scale, bool):  # fixed: update() keeps it
            self._scale_update_param = float(loss_scale)
            self.loss_scaler = scaler_type(self.device_type, init_scale=float(loss_scale))
        elif isinstance(loss_scale, dict):
            self.loss_scaler = scaler_type(self.device_type, **loss_scale)
        else:
            raise TypeError(f"optim_wrapper.loss_scale takes 'dynamic', a number (a fixed scale) or a dict of "
                            f"torch.amp.GradScaler's arguments, got {loss_scale!r}")

    @contextmanager
    def optim_context(self, model: nn.Module):
        """``OptimWrapper``'s context (no gradient sync while accumulating) under autocast."""
        with OptimWrapper.optim_context(self, model), torch.autocast(self.device_type, dtype=self.cast_dtype):
            yield
