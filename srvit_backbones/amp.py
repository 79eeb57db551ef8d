"""Mixed precision for the tools, one rule on every device: ``--amp`` means fp16 autocast on
CUDA and bf16 autocast on a CPU with native bf16 (AVX512-BF16 or AMX); on a CPU without it,
a clear error instead of an emulated bf16 that is slower than fp32."""
import contextlib
from typing import ContextManager, Optional

import torch


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products natively (AVX512-BF16 or AMX tiles)."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def amp_dtype(device: str) -> torch.dtype:
    """The autocast dtype ``--amp`` uses on ``device`` ('cpu', 'cuda', 'cuda:1', ...), or a
    ValueError that says why there is none and what to do."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.float16
    if kind == "cpu":
        if not cpu_has_native_bf16():
            raise ValueError("--amp on the CPU runs bf16, but this CPU has no native bf16 (AVX512-BF16 or AMX): "
                             "emulated bf16 is slower than fp32, so run without --amp")
        return torch.bfloat16
    raise ValueError(f"--amp supports 'cuda' and 'cpu' devices, got {device!r}")


def autocast(device: str, enabled: bool, dtype: Optional[torch.dtype] = None) -> ContextManager:
    """``torch.autocast`` for ``--amp`` on ``device`` (see ``amp_dtype``); a no-op when not enabled."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype or amp_dtype(device))
