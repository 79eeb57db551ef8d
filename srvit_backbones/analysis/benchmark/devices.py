"""The GPU check's (e): the device branches of the relative-position attention against the CPU's fp32."""
import torch

from ... import SRViT
from ...models.rel_pos import KERNELS, choose_kernel, rel_pos_attention
from ...models.window import window_qkv
from ...training import amp
from .timing import cosine


def kernel_choice_rows():
    """Rows of the GPU's kernel and block choices against the CPU's on CPU tensors (padded windows,
    whole windows, a global grid), each within 1e-5."""
    rows = []
    for name, grid, window in (("padded_windows", (6, 7), 3), ("windows", (6, 6), 3), ("global", (9, 9), 0)):
        results = kernel_under_both_choices(grid, window)
        diff = max((a - b).abs().max().item() for a, b in zip(results["cuda"], results["cpu"]))
        rows.append(dict(case=f"rel-pos kernel, GPU choices on the CPU, {name}", max_abs_diff=diff,
                         tolerance=1e-5, ok=diff <= 1e-5))
    return rows


def kernel_inputs(grid, window):
    """[q, k, v, tables] of a grid's (padded) windows or, ``window`` 0, the whole grid (heads of 16:
    compiled flex takes no fewer), and the attended (h, w)."""
    heads, C = 2, 16
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, grid[0] * grid[1], 3 * heads * C, generator=g)
    if window:
        q, k, v = window_qkv(qkv, torch.randn(3 * heads * C, generator=g), grid, window, heads)
    else:
        q, k, v = qkv.view(2, -1, 3, heads, C).permute(2, 0, 3, 1, 4).unbind(0)
    size = (window, window) if window else grid
    tables = [torch.randn(2 * n - 1, C, generator=g).mul_(0.3) for n in size]
    return [t.contiguous() for t in (q, k, v)] + tables, size


def kernel_under_both_choices(grid, window, block_elements=None):
    """{"cpu" / "cuda": [out, *grads]}: ``rel_pos_attention`` on CPU tensors under each device's choices."""
    tensors, size = kernel_inputs(grid, window)
    inputs = [t.requires_grad_() for t in tensors]
    results = {}
    for device_type in ("cpu", "cuda"):
        out = rel_pos_attention(*inputs, size, 0.0, block_elements, device_type=device_type)
        results[device_type] = [out, *torch.autograd.grad((out * out.detach().cos()).sum(), inputs)]
    return results


#: (row name, kernel, block_elements): each kernel, and ``bias`` in calls of one map (a GPU beyond GPU_BIAS_ELEMENTS)
FORCED_KERNELS = [(name, name, None) for name in KERNELS] + [("bias in calls of one map", "bias", 1)]


def kernels_on_device_against_cpu(device):
    """Rows of each kernel forced on ``device`` in fp16 and bf16 against the CPU's fp32: output cosine
    >= 0.999, gradients' >= 0.99 (the tables' reported apart), for padded windows and a global grid.
    Flex has no backward on the CPU: there its forward alone."""
    device = torch.device(device)
    rows = []
    for case, grid, window in (("windows", (6, 7), 3), ("global", (9, 9), 0)):
        tensors, size = kernel_inputs(grid, window)
        reference = [t.clone().requires_grad_() for t in tensors]
        expected = rel_pos_attention(*reference, size)
        expected_grads = torch.autograd.grad((expected * expected.detach().cos()).sum(), reference)
        for dtype in (torch.float16, torch.bfloat16):
            if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
                continue
            for name, kernel, block_elements in FORCED_KERNELS:
                trains = not (kernel == "flex" and device.type == "cpu")
                inputs = [t.detach().to(device, dtype if i < 3 else torch.float32).requires_grad_(trains)
                          for i, t in enumerate(tensors)]
                out = rel_pos_attention(*inputs, size, 0.0, block_elements, kernel=kernel)
                row = dict(case=f"rel-pos kernel {name}, {case}, {device.type} {str(dtype)[6:]} against CPU fp32",
                           output_cosine=cosine(out.float().cpu(), expected))
                if trains:
                    grads = torch.autograd.grad((out.float() * out.detach().float().cos()).sum(), inputs)
                    cosines = [cosine(g.float().cpu(), e) for g, e in zip(grads, expected_grads)]
                    row["min_gradient_cosine"], row["min_table_gradient_cosine"] = min(cosines), min(cosines[3:])
                row["ok"] = row["output_cosine"] >= 0.999 and row.get("min_gradient_cosine", 1.0) >= 0.99
                rows.append(row)
    return rows


def model_on_device_against_cpu(device):
    """Rows of a tiny windowed rel-pos model on ``device`` against the CPU: fp32 to 1e-4 (TF32 off),
    fp16 / bf16 autocast by cosine. On the CPU the device side runs the GPU's kernel."""
    device = torch.device(device)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        return _compare_on_device(device, choose_kernel("cuda") if device.type == "cpu" else None)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _tiny_model(rel_pos_kernel):
    torch.manual_seed(0)
    model = SRViT(img_size=112, embed_dim=64, num_heads=2, layout=(2, 1), num_steps=3, num_classes=0,
                  window_size=3, use_rel_pos=True, rel_pos_kernel=rel_pos_kernel)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model


def _compare_on_device(device, forced_kernel):
    model = _tiny_model(None)  # the reference: the CPU's own kernel
    x = torch.randn(2, 3, 112, 112)

    def run(module, inputs, dtype=None):
        module.zero_grad()
        with amp.autocast(str(inputs.device), dtype is not None, dtype):
            features = module.forward_features(inputs)
        features.float().square().sum().backward()
        # copies: for fp32 CPU tensors .float().cpu() is the grad itself, which module.to(device) then moves
        return (features.detach().float().cpu().clone(),
                [p.grad.float().cpu().clone() for p in module.parameters() if p.grad is not None])

    ref_features, ref_grads = run(model, x)
    kernels = dict(kernel=choose_kernel(device.type, forced_kernel), reference_kernel=choose_kernel("cpu"))
    gpu = _tiny_model(forced_kernel).to(device)
    rows = []
    for dtype in (None, torch.float16, torch.bfloat16):
        if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            continue
        features, grads = run(gpu, x.to(device), dtype)
        case = f"tiny windowed rel-pos model, {device.type} {str(dtype or 'fp32').replace('torch.', '')}"
        if dtype is None:
            diff = max((features - ref_features).abs().max().item(),
                       max((a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)
                           for a, b in zip(grads, ref_grads)))
            rows.append(dict(case=f"{case} against CPU fp32", **kernels, max_abs_diff=diff, tolerance=1e-4,
                             ok=diff <= 1e-4))
        else:
            cos_out = cosine(features, ref_features)
            cos_grad = min(cosine(a, b) for a, b in zip(grads, ref_grads))
            rows.append(dict(case=f"{case} autocast against CPU fp32", **kernels, feature_cosine=cos_out,
                             min_gradient_cosine=cos_grad, ok=cos_out >= 0.999 and cos_grad >= 0.99))
    return rows
