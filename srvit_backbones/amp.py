"""Mixed precision, one rule for every tool and device: ``--amp`` (``auto``) means fp16 autocast
with a GradScaler on CUDA and bf16 autocast on a CPU with native bf16 (AVX512-BF16 or AMX);
``bf16`` / ``fp16`` choose the dtype where the device runs it; anything else is a clear
error, never a silent fp32 run (an emulated bf16 is slower than fp32, so it is refused too)."""
import contextlib
from typing import ContextManager, Optional

import torch

#: the values of a tool's ``--amp``: ``auto`` is the device's dtype (``amp_dtype``)
PRECISIONS = ("auto", "fp16", "bf16", "none")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products natively (AVX512-BF16 or AMX tiles)."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def amp_dtype(device: str) -> torch.dtype:
    """The autocast dtype ``--amp`` uses on ``device`` ('cpu', 'cuda', 'cuda:1', ...), or a
    ValueError that says why there is none and what to do."""
    return resolve_precision(device, "auto")


def resolve_precision(device: str, precision: str) -> Optional[torch.dtype]:
    """The autocast dtype of ``--amp PRECISION`` (one of ``PRECISIONS``) on ``device``; None
    for ``none`` (fp32); a ValueError naming the fix where the device cannot run it."""
    if precision not in PRECISIONS:
        raise ValueError(f"--amp takes one of {PRECISIONS}, got {precision!r}")
    if precision == "none":
        return None
    kind = torch.device(device).type
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"--amp supports 'cuda' and 'cpu' devices, got {device!r}")
    if kind == "cuda":
        return torch.bfloat16 if precision == "bf16" else torch.float16
    if precision == "fp16":
        raise ValueError("--amp fp16 needs a GPU (fp16 autocast with a GradScaler); on the CPU use --amp bf16 "
                         "(a CPU with native bf16) or --amp none")
    if not cpu_has_native_bf16():
        raise ValueError("--amp on the CPU runs bf16, but this CPU has no native bf16 (AVX512-BF16 or AMX): "
                         "emulated bf16 is slower than fp32, so run without --amp (--amp none)")
    return torch.bfloat16


def needs_grad_scaler(dtype: Optional[torch.dtype]) -> bool:
    """fp16's gradients underflow without loss scaling; bf16 has fp32's range and needs none."""
    return dtype == torch.float16


def autocast(device: str, enabled: bool, dtype: Optional[torch.dtype] = None) -> ContextManager:
    """``torch.autocast`` for ``--amp`` on ``device`` (see ``amp_dtype``); a no-op when not enabled."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype or amp_dtype(device))
