"""``--amp`` of the package's own loops and tools: fp16 on CUDA, native bf16 on a CPU (docs/models.md)."""
import contextlib
import warnings
from typing import ContextManager, Optional

import torch

#: the values of a tool's ``--amp``: ``auto`` is the device's dtype (``amp_dtype``)
PRECISIONS = ("auto", "fp16", "bf16", "none")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products natively (AVX512-BF16 or AMX tiles)."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def cpu_has_native_fp16() -> bool:
    """Whether this CPU computes fp16 matrix products natively (AMX-FP16; torch cannot check AVX512-FP16)."""
    check = getattr(getattr(torch, "cpu", None), "_is_amx_fp16_supported", None)
    return bool(check is not None and check())


def amp_dtype(device: str) -> torch.dtype:
    """The autocast dtype ``--amp`` uses on ``device``, or a ValueError that says why there is none."""
    return resolve_precision(device, "auto")


def resolve_precision(device: str, precision: str) -> Optional[torch.dtype]:
    """The autocast dtype of ``--amp PRECISION`` on ``device`` (None: fp32).

    Raises:
        ValueError: an unknown precision or device, or ``auto`` on a CPU without native bf16."""
    if precision not in PRECISIONS:
        raise ValueError(f"--amp takes one of {PRECISIONS}, got {precision!r}")
    if precision == "none":
        return None
    kind = torch.device(device).type
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"--amp supports 'cuda' and 'cpu' devices, got {device!r}")
    if kind == "cuda":
        return torch.bfloat16 if precision == "bf16" else torch.float16
    if precision == "auto":
        if not cpu_has_native_bf16():
            raise ValueError("--amp on the CPU runs bf16, but this CPU has no native bf16 (AVX512-BF16 or AMX): "
                             "emulated bf16 is slower than fp32, so run without --amp (--amp none)")
        return torch.bfloat16
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    if not (cpu_has_native_bf16() if dtype == torch.bfloat16 else cpu_has_native_fp16()):
        warnings.warn(f"{precision} on this CPU is emulated, slower than fp32: it runs the GPU's {precision} code "
                      f"path (for checking it), not faster training; for speed train in fp32", stacklevel=2)
    return dtype


def needs_grad_scaler(dtype: Optional[torch.dtype]) -> bool:
    """fp16's gradients underflow without loss scaling; bf16 has fp32's range and needs none."""
    return dtype == torch.float16


def autocast(device: str, enabled: bool, dtype: Optional[torch.dtype] = None) -> ContextManager:
    """``torch.autocast`` for ``--amp`` on ``device`` (see ``amp_dtype``); a no-op when not enabled."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype or amp_dtype(device))
