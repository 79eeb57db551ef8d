"""``DeviceAmpOptimWrapper``: mmengine's ``AmpOptimWrapper`` on the run's device type, CUDA or
CPU, by the package's one mixed-precision rule (``srvit_backbones.amp``). ``prepare_training``
(and so ``SRViTRunner``, ``mim train`` included) makes every config's ``AmpOptimWrapper`` this
one; it is registered in mmengine's root ``OPTIM_WRAPPERS``, which mmseg's and mmdet's registries
fall back to."""
from contextlib import contextmanager
from numbers import Real
from typing import Dict, Optional, Union

import torch
import torch.nn as nn
from mmengine.device import get_device
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS, DefaultScope

from .. import amp

#: the devices mmengine's own ``AmpOptimWrapper`` runs on and ours does not (it also runs on CUDA)
MMENGINE_AMP_DEVICES = ("npu", "mlu", "musa")
#: Why a framework's models cannot train in mixed precision on a CPU, by its configs'
#: ``default_scope``: its package says so on import (``srvit_backbones.mmdet``: mmcv's CPU kernels).
#: ``tools.apply_amp`` and ``tools.prepare_training`` refuse such a run, naming the reason and fp32.
CPU_MIXED_PRECISION_REFUSED: Dict[str, str] = {}
#: an ``AmpOptimWrapper`` ``dtype`` (mmengine's names; torch dtypes too) as ``srvit_backbones.amp``'s ``--amp`` value
PRECISION_OF_DTYPE = {None: "auto", "float16": "fp16", "bfloat16": "bf16"}


def device_kind(device: Union[str, torch.device]) -> str:
    """The type of ``device`` ('cuda:1' -> 'cuda'), also of a device torch knows only with its
    plugin installed ('npu' needs torch_npu for ``torch.device``)."""
    return str(device).split(":")[0]


def cpu_mixed_precision_refused(scope: Optional[str], device_type: str) -> Optional[str]:
    """Why the models of the framework ``scope`` (a config's ``default_scope``) cannot train in
    mixed precision on ``device_type``, where it is a CPU and the framework's package said so
    (``CPU_MIXED_PRECISION_REFUSED``); None where they can."""
    why = CPU_MIXED_PRECISION_REFUSED.get(scope) if device_kind(device_type) == "cpu" else None
    return f"mixed precision on the CPU cannot train {scope}'s models: {why}" if why else None


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

    A framework whose models cannot train in mixed precision on a CPU (``CPU_MIXED_PRECISION_REFUSED``,
    by the run's default scope: mmdet) is refused on a CPU, naming why and fp32.

    ``__init__`` repeats mmengine 0.10.7's without what ties it to CUDA: its assert of a GPU (NPU,
    MLU or MUSA) and its ``torch.cuda.amp.GradScaler`` (a ``torch.amp.GradScaler`` of the device
    type here); ``optim_context`` enters ``torch.autocast(device_type, dtype)`` instead of
    ``mmengine.runner.amp.autocast``, which allows only bf16 on the CPU."""

    def __init__(self, loss_scale: Union[str, float, dict] = "dynamic", dtype: Union[None, str, torch.dtype] = None,
                 use_fsdp: bool = False, device_type: Optional[str] = None, **kwargs):
        OptimWrapper.__init__(self, **kwargs)  # not AmpOptimWrapper's: it asserts a GPU
        self.device_type = device_kind(device_type or get_device())
        self.cast_dtype = amp_optim_dtype(self.device_type, dtype)
        scope = DefaultScope.get_current_instance()  # the run's framework, as the Runner set it
        refused = cpu_mixed_precision_refused(scope and scope.scope_name, self.device_type)
        if refused:  # mim train's scripts build the wrapper without our tools' check (tools.apply_amp)
            raise ValueError(f"{refused}: train in fp32, --cfg-options optim_wrapper.type=OptimWrapper")
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
