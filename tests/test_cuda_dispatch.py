"""CUDA's SDPA dispatch emulated on the CPU (tests/cuda_dispatch.py): torch's eligibility
rules for cuDNN, flash, memory-efficient and math on known calls; the operations CUDA's composite
adds (padding copies); and, under it, what the GPU's choices of relative-position kernel cost: a
fused backend in every training call, at most 40 operations per application, the windowed
backbone's training step within 1.4x the global one's. Meta tensors: shapes only, no memory."""
import pytest
import torch
import torch.nn.functional as F

import srvit_backbones  # noqa: F401  (registers the variants)
from cuda_dispatch import CudaSDPARules, backbone_step_operations, count_cuda_launches, sdpa_backend
from srvit_backbones.models.rel_pos import KERNELS, rel_pos_attention

HALF = torch.float16


def meta(*shape, dtype=HALF, grad=True, **kwargs):
    return torch.empty(*shape, device="meta", dtype=dtype, **kwargs).requires_grad_(grad)


def test_the_backend_follows_torchs_rules():
    """cuDNN first on an H100 (torch 2.14, CUDA 13, cuDNN 9.24); a mask that needs a gradient, or
    fp32, takes the memory-efficient kernel; head dims that are not multiples of 8 take flash
    (which pads them); cuDNN's backward refuses (192, 192), which flash takes; inference takes
    cuDNN up to 256; an older cuDNN puts flash first."""
    q = meta(2, 6, 196, 64)
    assert sdpa_backend(q, q, q) == "cudnn"
    assert sdpa_backend(q, q, q, attn_mask=meta(2, 6, 196, 196, grad=False)) == "cudnn"
    assert sdpa_backend(q, q, q, attn_mask=meta(2, 6, 196, 196)) == "efficient"
    fp32 = meta(2, 6, 196, 64, dtype=torch.float32)
    assert sdpa_backend(fp32, fp32, fp32) == "efficient"
    odd = meta(2, 6, 196, 92)
    assert sdpa_backend(odd, odd, odd) == "flash"
    wide = meta(2, 6, 4096, 192)
    assert sdpa_backend(wide, wide, wide) == "flash"
    with torch.no_grad():
        assert sdpa_backend(wide, wide, wide) == "cudnn"
    assert sdpa_backend(meta(2, 6, 196, 96), meta(2, 6, 196, 96), q) == "cudnn"  # (96, 64) trains on cuDNN
    assert sdpa_backend(wide, wide, meta(2, 6, 4096, 64)) == "efficient"  # (192, 64): neither cuDNN nor flash
    assert sdpa_backend(q, q, q, rules=CudaSDPARules(cudnn_version=91002)) == "flash"
    assert sdpa_backend(meta(2, 6, 196, 64, dtype=torch.float64), q, q) == "math"


def test_the_composites_padding_copies_are_counted():
    """What ``attention.cpp`` adds around a fused kernel: flash pads q, k, v of head dim 92 to 96
    (3 copies forward, their 3 backward, the output's slice backward); the memory-efficient kernel
    pads a 196-key bias to a stride of 8 (one copy forward; one slice backward and one copy
    backward when the bias trains); cuDNN, with aligned inputs, runs its two kernels only."""
    def step(q, k, v, mask=None):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.autograd.grad(out, [t for t in (q, k, v, mask) if t is not None], torch.empty_like(out))

    odd = [meta(2, 6, 196, 92) for _ in range(3)]
    counter, calls = count_cuda_launches(step, *odd)
    assert calls[0]["backend"] == "flash" and counter.ops["constant_pad_nd"] == 6 and counter.ops["slice_backward"] == 1
    qkv = [meta(2, 6, 196, 64) for _ in range(3)]
    counter, calls = count_cuda_launches(step, *qkv, meta(2, 6, 196, 196))
    assert calls[0]["backend"] == "efficient" and calls[0]["mask_requires_grad"]
    assert counter.ops["constant_pad_nd"] == 2 and counter.ops["slice_backward"] == 1
    counter, calls = count_cuda_launches(step, *qkv)
    assert dict(counter.ops) == {"_scaled_dot_product_cudnn_attention": 1,
                                 "_scaled_dot_product_cudnn_attention_backward": 1}


def test_the_emulated_call_computes_sdpas_result():
    """The emulation changes what is counted, not the result: outputs and gradients of CPU
    tensors equal plain SDPA's, for each backend it picks."""
    g = torch.Generator().manual_seed(0)
    for head_dim, mask in ((64, False), (92, False), (64, True)):
        tensors = [torch.randn(2, 3, 20, head_dim, generator=g).half().requires_grad_() for _ in range(3)]
        if mask:
            tensors.append(torch.randn(2, 3, 20, 20, generator=g).half().requires_grad_())

        def run(tensors=tensors, mask=mask):
            out = F.scaled_dot_product_attention(*tensors[:3], attn_mask=tensors[3] if mask else None)
            return [out, *torch.autograd.grad(out.float().square().sum(), tensors)]

        expected = run()
        got = []
        _, calls = count_cuda_launches(lambda got=got, run=run: got.extend(run()))
        assert calls[0]["backend"] == ("efficient" if mask else "flash" if head_dim == 92 else "cudnn")
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)


#: one relative-position application at ViTDet's geometry (1024, 6 heads of 64): (images, grid)
APPLICATIONS_1024 = {"global_batch_2": (2, (64, 64)), "windows_batch_2": (2 * 25, (14, 14)),
                     "windows_batch_16": (16 * 25, (14, 14))}


def application_step(images, grid, kernel=None, dtype=HALF):
    """A training step of one application with the GPU's choices (``device_type='cuda'``): q, k,
    v in ``dtype`` (as autocast gives them), float32 tables, on meta tensors; its operations and
    SDPA calls under the emulated dispatch (the constants made by a first step)."""
    n = grid[0] * grid[1]
    tensors = [meta(images, 6, n, 64, dtype=dtype) for _ in range(3)]
    tensors += [meta(2 * side - 1, 64, dtype=torch.float32) for side in grid]
    grad_out = meta(images, 6, n, 64, dtype=dtype, grad=False)

    def step():
        out = rel_pos_attention(*tensors, grid, device_type="cuda", kernel=kernel)
        torch.autograd.grad(out, tensors, grad_out)

    step()
    return count_cuda_launches(step)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("case", APPLICATIONS_1024)
def test_the_gpus_choice_trains_on_a_fused_backend_in_at_most_40_operations(case, dtype):
    """The GPU's rule (``folded``) at 1024: every SDPA call of a training step runs a fused
    backend (cuDNN for windows, flash for the global grid; the memory-efficient kernel in fp32),
    one call, and the step takes at most 40 operations (the ``bias`` kernel took 31 for windows
    and 43 for the global grid at batch 2, on the memory-efficient kernel)."""
    counter, calls = application_step(*APPLICATIONS_1024[case], dtype=dtype)
    assert len(calls) == 1 and calls[0]["training"]
    expected = "efficient" if dtype == torch.float32 else "flash" if case.startswith("global") else "cudnn"
    assert calls[0]["backend"] == expected, calls
    assert counter.total <= 40, counter.ops


def test_the_bias_kernel_is_what_the_rule_avoids():
    """Why not ``bias`` on a GPU, as emulated: its bias needs a gradient, so every call trains on
    the memory-efficient kernel; the 196-key window bias is padded to a stride of 8 (2
    copies and a slice backward per step); the global grid at batch 2 takes 2 checkpointed calls
    (4 forwards, 2 backwards)."""
    counter, calls = application_step(*APPLICATIONS_1024["windows_batch_2"], kernel="bias")
    assert {c["backend"] for c in calls} == {"efficient"}
    assert counter.ops["constant_pad_nd"] == 2 and counter.ops["slice_backward"] == 1
    counter, calls = application_step(*APPLICATIONS_1024["global_batch_2"], kernel="bias")
    assert counter.ops["_scaled_dot_product_efficient_attention"] == 4
    assert counter.ops["_scaled_dot_product_efficient_attention_backward"] == 2


def test_every_kernel_runs_under_the_emulation():
    """``folded``, ``bias`` and ``blocked`` (flex compiles itself and is not dispatched op by op)
    count on meta tensors: the emulation does not depend on the kernel."""
    for kernel in KERNELS:
        if kernel != "flex":
            counter, _ = application_step(2, (5, 7), kernel=kernel)
            assert counter.total > 0


@pytest.mark.parametrize("batch", [1, 2])
def test_the_windowed_backbones_training_step_takes_at_most_1_4x_the_global_ones_operations(batch):
    """Issue 43's target: a whole S-T3 training step at 1024 (forward, backward) with ViTDet's
    windows and relative positions issues at most 1.4x the operations of the global S-T3 step
    under the emulated dispatch (about 1.6x before the windows were gathered by index and the
    constants cached; 2x with the ``bias`` kernel), and every SDPA call of both is fused."""
    global_ops, global_calls = backbone_step_operations("srvit_s_t3", 1024, batch)
    windowed_ops, windowed_calls = backbone_step_operations("srvit_s_t3", 1024, batch, window_size=14,
                                                            use_rel_pos=True)
    assert windowed_ops.total <= 1.4 * global_ops.total, (windowed_ops.total, global_ops.total)
    assert all(c["backend"] != "math" for c in global_calls + windowed_calls)
    assert len(windowed_calls) == len(global_calls) == 32  # 2 + 10 x 3 block applications
