"""CUDA's SDPA dispatch emulated on the CPU: which backend a CUDA GPU would run a
``F.scaled_dot_product_attention`` call on (cuDNN, flash, memory-efficient or math), by torch's
own eligibility rules (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` and
``sdp_utils_cpp.h``), and the operations it would issue for it (``attention.cpp``'s composite:
the head-dim padding of flash, the bias padding of the memory-efficient kernel, one fused
forward and one fused backward), so that a kernel's GPU cost can be judged without a GPU.

The CPU runs another path: its SDPA is a math decomposition (a dozen operations, more in
training) or its own flash kernel, so the launch counter alone measures the CPU, not a GPU.
``EmulatedCudaSDPA`` replaces every SDPA call made inside it with what CUDA would run, counted
into a ``LaunchCounter``: the fused call as one operation each way (its result computed
uncounted on the tensors' own device, meta tensors included), the padding copies as the real
operations. ``count_cuda_launches`` counts a function under it.

Modelled: the GPU of ``CudaSDPARules`` (by default an H100 with torch 2.14's CUDA 13 build and
cuDNN 9.24, where torch puts cuDNN first in the priority order, ``check_prefer_cudnn_attention``),
dense 4-D inputs, no nested tensors, no GQA; what a rule checks that a tensor on the CPU cannot
show (the device) is assumed true.

A test helper (tests/test_cuda_dispatch.py): it judges our kernels' GPU path on a machine without
a GPU; ``tools/benchmark.py --attention`` times the real thing on one.
"""
import contextlib
import dataclasses
import math
from typing import List

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

from srvit_backbones.analysis.benchmark.launches import LaunchCounter
from srvit_backbones.models.rel_pos import LOW_PRECISION

BACKENDS = ("cudnn", "flash", "efficient", "math")
#: each fused backend's forward and backward operation, as CUDA's composite calls them
FUSED_OPS = {"cudnn": "_scaled_dot_product_cudnn_attention", "flash": "_scaled_dot_product_flash_attention",
             "efficient": "_scaled_dot_product_efficient_attention"}


@dataclasses.dataclass(frozen=True)
class CudaSDPARules:
    """What torch's SDPA rules read of the GPU and its libraries."""
    capability: tuple = (9, 0)
    cudnn_version: int = 92400  # torch 2.14.1's CUDA 13 wheels ship cuDNN 9.24 (torch.backends.cudnn.version())
    cudnn_frontend_d256: bool = True  # cuDNN frontend >= 1.24 (head dims up to 256 on sm90 / sm10x)

    @property
    def order(self):
        """torch's priority order: cuDNN first on sm90 / sm10x with cuDNN newer than 9.15.0 (CUDA 13
        builds), else flash, memory-efficient, math (cuDNN after math is never reached)."""
        if self.cudnn_version > 91500 and self.capability[0] in (9, 10):
            return ("cudnn", "flash", "efficient", "math")
        return ("flash", "efficient", "math", "cudnn")

    @property
    def sm90_or_sm10x(self) -> bool:
        return self.capability == (9, 0) or self.capability[0] == 10


H100 = CudaSDPARules()


def _requires_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))


def _same_dtype_in(q, k, v, dtypes) -> bool:
    return q.dtype == k.dtype == v.dtype and q.dtype in dtypes


def _dense_4d_same_batch_and_heads(q, k, v) -> bool:
    return q.dim() == k.dim() == v.dim() == 4 and q.shape[0] == k.shape[0] == v.shape[0] and \
        q.shape[1] == k.shape[1] == v.shape[1] and q.shape[2] > 0 and k.shape[2] > 0


def _last_stride_one(q, k, v, ignore_singleton: bool) -> bool:
    ok = all(t.stride(-1) == 1 for t in (q, k, v))
    return ok or (ignore_singleton and q.shape[-1] == 1)


def _mask_shape_ok(mask, q, k) -> bool:
    if mask is None:
        return True
    if mask.requires_grad or mask.shape[-2] not in (q.shape[2], 1) or mask.shape[-1] not in (k.shape[2], 1):
        return False
    return mask.dim() == 2 or (mask.dim() == 4 and mask.shape[0] in (1, q.shape[0])
                               and mask.shape[1] in (1, q.shape[1]))


def can_use_cudnn(q, k, v, mask, dropout_p, rules: CudaSDPARules = H100) -> bool:
    """``can_use_cudnn_attention``: fp16 / bf16, a mask that needs no gradient, dropout in 1/16,
    head dims multiples of 8 within the limit (256 on sm90 / sm10x with cuDNN > 9.22 and a
    d256 frontend, else 128), and in training on such a GPU (q.k, v) of at most (128, 128), or
    exactly (192, 128) or (256, 256)."""
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if not (_dense_4d_same_batch_and_heads(q, k, v) and _same_dtype_in(q, k, v, LOW_PRECISION)
            and _mask_shape_ok(mask, q, k) and dropout_p * 16 == math.floor(dropout_p * 16)
            and _last_stride_one(q, k, v, ignore_singleton=True) and rules.capability >= (8, 0)
            and q.shape[0] <= 65535 and q.shape[1] <= 65535 and k.shape[2] != 1):
        return False
    d256 = rules.sm90_or_sm10x and rules.cudnn_version > 92200 and rules.cudnn_frontend_d256
    limit = 256 if d256 else 192 if rules.sm90_or_sm10x and rules.cudnn_version >= 91100 and \
        (d_qk, d_v) == (192, 128) else 128
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False
    if d256 and _requires_grad(q, k, v):
        return (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))
    return True


def can_use_flash(q, k, v, mask, dropout_p, rules: CudaSDPARules = H100) -> bool:
    """``can_use_flash_attention``: no mask, one head dim of at most 256 for q, k and v, fp16 /
    bf16, sm80 and newer."""
    return mask is None and _dense_4d_same_batch_and_heads(q, k, v) and \
        q.shape[-1] == k.shape[-1] == v.shape[-1] <= 256 and _same_dtype_in(q, k, v, LOW_PRECISION) and \
        rules.capability >= (8, 0) and _last_stride_one(q, k, v, ignore_singleton=True)


def gemm_alignment(dtype: torch.dtype, rules: CudaSDPARules = H100) -> int:
    """``minimum_gemm_alignment``: 8 elements for fp16 / bf16 on tensor cores, 4 for fp32 (sm80+)."""
    half = dtype in LOW_PRECISION
    tensor_cores = rules.capability >= (8, 0) or (rules.capability >= (7, 0) and half)
    alignment = 4 if rules.capability >= (8, 0) else 1
    return max(alignment, 128 // (16 if half else 32)) if tensor_cores else alignment


def can_use_efficient(q, k, v, mask, dropout_p, rules: CudaSDPARules = H100) -> bool:
    """``can_use_mem_efficient_attention``: any mask (a bias that needs a gradient included),
    q.k and v head dims multiples of the GEMM alignment (v may differ), storage offsets aligned."""
    align = gemm_alignment(q.dtype, rules)
    dtypes = (torch.float16, torch.float32, torch.bfloat16) if rules.capability >= (8, 0) else \
        (torch.float16, torch.float32)
    return _dense_4d_same_batch_and_heads(q, k, v) and q.shape[-1] == k.shape[-1] and \
        q.shape[-1] % align == 0 and v.shape[-1] % align == 0 and \
        all(t.storage_offset() % align == 0 for t in (q, k, v)) and \
        _last_stride_one(q, k, v, ignore_singleton=False) and _same_dtype_in(q, k, v, dtypes)


CHECKS = {"cudnn": can_use_cudnn, "flash": can_use_flash, "efficient": can_use_efficient,
          "math": lambda *args, **kwargs: True}


def sdpa_backend(q, k, v, attn_mask=None, dropout_p=0.0, rules: CudaSDPARules = H100) -> str:
    """The backend CUDA's ``select_sdp_backend`` would pick for this call (one of BACKENDS): the
    first of the rules' priority order whose checks pass. Training (grad mode on and an input
    that requires grad) is read from the tensors, as torch reads it."""
    for backend in rules.order:
        if CHECKS[backend](q, k, v, attn_mask, dropout_p, rules):
            return backend
    raise AssertionError("math is always eligible")


class _FusedCall(torch.autograd.Function):
    """One fused SDPA kernel: counted as one operation forward and one backward; its result
    (and gradients) computed by the tensors' own device, uncounted."""

    @staticmethod
    def forward(ctx, emulation, op, q, k, v, mask, dropout_p, scale):
        with _disable_current_modes(), emulation.passing():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
            # laid out as CUDA's fused kernels return it: (batch, queries, heads, C) in memory
            out = out.transpose(1, 2).contiguous().transpose(1, 2)
        emulation.counter.ops[op] += 1
        ctx.emulation, ctx.op, ctx.dropout_p, ctx.scale = emulation, op, dropout_p, scale
        ctx.save_for_backward(q, k, v, mask)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        with ctx.emulation.active():  # a checkpointed call recomputes its forward here, emulated as at first
            inputs = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:6]
        with _disable_current_modes(), torch.enable_grad(), ctx.emulation.passing():
            leaves = [None if t is None else t.detach().requires_grad_(need) for t, need in zip(inputs, needs)]
            out = F.scaled_dot_product_attention(*leaves[:3], attn_mask=leaves[3], dropout_p=ctx.dropout_p,
                                                 scale=ctx.scale)
            wanted = [t for t, need in zip(leaves, needs) if need]
            grads = iter(torch.autograd.grad(out, wanted, grad_out))
        ctx.emulation.counter.ops[ctx.op + "_backward"] += 1
        return (None, None, *(next(grads) if need else None for need in needs), None, None)


class EmulatedCudaSDPA(TorchFunctionMode):
    """Inside it, every ``F.scaled_dot_product_attention`` call runs as CUDA would run it
    (``sdpa_backend``'s choice, with its composite's padding), counted into ``counter`` (a
    ``LaunchCounter``, which the caller enters for the other operations); ``calls`` lists each
    call's backend, shapes and whether it trained."""

    def __init__(self, counter: LaunchCounter, rules: CudaSDPARules = H100):
        super().__init__()
        self.counter, self.rules = counter, rules
        self.calls: List[dict] = []
        self._passing = False

    @contextlib.contextmanager
    def active(self):
        """The emulation on the torch-function mode stack: autograd runs a backward without the
        caller's modes, and a checkpoint's recomputation must run emulated, as its forward did."""
        if self in torch.overrides._get_current_function_mode_stack():
            yield
        else:
            with self:
                yield

    @contextlib.contextmanager
    def passing(self):
        """SDPA calls inside run as they are (the emulation's own computations)."""
        previous, self._passing = self._passing, True
        try:
            yield
        finally:
            self._passing = previous

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or self._passing:
            return func(*args, **kwargs)
        return self._sdpa(*args, **kwargs)

    def _sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if is_causal or enable_gqa:
            raise NotImplementedError("the emulation models non-causal calls without GQA")
        backend = sdpa_backend(q, k, v, attn_mask, dropout_p, self.rules)
        self.calls.append(dict(backend=backend, q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape),
                               mask=None if attn_mask is None else tuple(attn_mask.shape),
                               mask_requires_grad=attn_mask is not None and attn_mask.requires_grad,
                               training=_requires_grad(q, k, v), dtype=str(q.dtype).replace("torch.", "")))
        if backend == "math":
            with self.passing():
                return torch.ops.aten._scaled_dot_product_attention_math(
                    q, k, v, attn_mask, dropout_p, False, None, scale=scale)[0]
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(q.dtype)
        if backend == "flash":  # pad_last_dim<8>: q, k, v padded to a multiple of 8, the output sliced
            head_dim = q.shape[-1]
            scale = head_dim ** -0.5 if scale is None else scale
            pad = -head_dim % 8
            if pad:
                q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
            out = _FusedCall.apply(self, FUSED_OPS[backend], q, k, v, None, dropout_p, scale)
            return out[..., :head_dim] if pad else out
        if backend == "efficient" and attn_mask is not None:  # preprocess_mask: strides aligned to 8
            if any(s % 8 for s in attn_mask.stride()[:-1]) or attn_mask.stride(-1) != 1:
                n = attn_mask.shape[-1]
                attn_mask = F.pad(attn_mask, (0, 8 - n % 8))[..., :n]
            attn_mask = attn_mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return _FusedCall.apply(self, FUSED_OPS[backend], q, k, v, attn_mask, dropout_p, scale)


def count_cuda_launches(fn, *args, rules: CudaSDPARules = H100, **kwargs):
    """``fn(*args, **kwargs)``'s operations with CUDA's SDPA dispatch emulated: (the
    ``LaunchCounter``, the emulation's ``calls``)."""
    counter = LaunchCounter()
    emulation = EmulatedCudaSDPA(counter, rules)
    with emulation, counter:
        fn(*args, **kwargs)
    return counter, emulation.calls


def backbone_step_operations(name: str, size: int, batch: int, dtype: torch.dtype = torch.float16,
                             rules: CudaSDPARules = H100, **model_args):
    """A whole backbone's training step (``forward_features``, then the gradients of every
    parameter from the mean square of the features) of ``name`` at ``size`` for ``batch``
    images, with CUDA's dispatch emulated: (the ``LaunchCounter``, the SDPA calls). Built and run
    on meta tensors in ``dtype`` (the weights too: autocast's per-weight casts, the same for any
    attention, are left out), so it costs no memory and runs the GPU's kernel choices; a first
    step makes the cached constants, the second is counted."""
    import timm

    with torch.device("meta"):
        model = timm.create_model(name, img_size=size, num_classes=0, **model_args).to(dtype)
    images = torch.empty(batch, 3, size, size, device="meta", dtype=dtype)
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        loss = model.forward_features(images).float().square().mean()
        torch.autograd.grad(loss, params, allow_unused=True)

    step()
    return count_cuda_launches(step, rules=rules)

