"""The relative-position attention kernels (``blocked``, ``bias``, ``flex``) against
detectron2's own formula (``add_decomposed_rel_pos`` on materialised scores), each run here on
the CPU, the GPU's choices included (``device_type='cuda'`` on CPU tensors); which kernel runs
where and in how many SDPA calls; the launches of a training step; graph breaks; the index made
once per extent; ``block(x)`` on every block a model builds."""
import pytest
import torch
import torch.nn.functional as F

from srvit_backbones import SRViT
from srvit_backbones.analysis.benchmark.attention import detectron2_formula as detectron2_attention
from srvit_backbones.analysis.benchmark.launches import count_launches
from srvit_backbones.models import apply_block, rel_pos
from srvit_backbones.models.rel_pos import bias_calls, choose_kernel, rel_pos_attention, rel_pos_lookup

#: (grid, images) of the cases: 2 images of a 5x7 grid, 6 windows of 4x4
CASES = {"global": ((5, 7), 2), "windows": ((4, 4), 6)}


def inputs(case, dtype=torch.float32, table_rows=None):
    (h, w), images = CASES[case]
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(images, 2, h * w, 8, generator=g) for _ in range(3)]
    rows_h, rows_w = table_rows or (2 * h - 1, 2 * w - 1)
    tables = [torch.randn(rows_h, 8, generator=g).mul_(0.5), torch.randn(rows_w, 8, generator=g).mul_(0.5)]
    return [t.to(dtype).requires_grad_() for t in qkv + tables], (h, w)


def grads_of(out, tensors, seed=1):
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out.float() * weights).sum(), tensors)


def cosine(a, b):
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


#: (kernel, device type, block_elements) of the kernels under test: ``blocked`` in blocks of grid
#: rows (200 scores) with the CPU's and the GPU's choices, ``bias`` with its whole bias and in
#: calls of one map each (200 elements), and the GPU's default
KERNEL_RUNS = {"blocked_cpu": ("blocked", "cpu", 200), "blocked_cuda": ("blocked", "cuda", 200),
               "folded": ("folded", "cuda", None), "bias_whole": ("bias", "cuda", None),
               "bias_calls": ("bias", "cuda", 200), "gpu_default": (None, "cuda", None)}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kernel,device_type,block_elements", KERNEL_RUNS.values(), ids=KERNEL_RUNS.keys())
@pytest.mark.parametrize("resized", [False, True], ids=["own_tables", "resized_tables"])
def test_every_kernel_equals_detectron2_in_fp32(case, kernel, device_type, block_elements, resized):
    """Forward to 1e-5 and every input's gradient (q, k, v and both tables) to 1e-5, also with
    tables of another length (interpolated as ViTDet does)."""
    tensors, size = inputs(case, table_rows=(5, 9) if resized else None)
    expected = detectron2_attention(*tensors, size)
    got = rel_pos_attention(*tensors, size, kernel=kernel, device_type=device_type, block_elements=block_elements)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_of(got, tensors), grads_of(expected, tensors)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


LOW_PRECISION_RUNS = ("blocked_cpu", "blocked_cuda", "folded", "bias_whole", "bias_calls")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kernel,device_type,block_elements", [KERNEL_RUNS[k] for k in LOW_PRECISION_RUNS],
                         ids=LOW_PRECISION_RUNS)
def test_every_kernel_in_low_precision_agrees_with_detectron2_in_fp32(case, kernel, device_type, block_elements,
                                                                      dtype):
    """fp16 / bf16 inputs: outputs and gradients by cosine against the fp32 formula, in the
    inputs' dtype; the GPU's recomputing backward (matmuls in the inputs' dtype, float32
    statistics) runs here with ``device_type='cuda'``."""
    tensors, size = inputs(case)
    expected = detectron2_attention(*tensors, size)
    low = [t.detach().to(dtype).requires_grad_() for t in tensors]
    got = rel_pos_attention(*low, size, kernel=kernel, device_type=device_type, block_elements=block_elements)
    assert got.dtype == dtype
    assert cosine(got, expected) > 0.999
    for g, e in zip(grads_of(got, low), grads_of(expected, tensors)):
        assert g.dtype == dtype and cosine(g, e) > 0.99


@pytest.mark.parametrize("case", CASES)
def test_flex_forward_equals_detectron2(case):
    """``flex_attention`` with the per-axis terms in its ``score_mod`` (eager on the CPU, where
    it has no backward): the forward to 1e-5."""
    tensors, size = inputs(case)
    tensors = [t.detach() for t in tensors]
    torch.testing.assert_close(rel_pos_attention(*tensors, size, kernel="flex"), detectron2_attention(*tensors, size),
                               rtol=1e-5, atol=1e-5)


def test_the_kernel_is_chosen_by_device_type_or_named():
    """The CPU keeps the kernel tuned there; any other device attends with ``folded``; a kernel
    named per call is the one that runs anywhere, and an unknown name is refused, naming the kernels."""
    assert choose_kernel("cpu") == "blocked" and choose_kernel("cuda") == choose_kernel("meta") == "folded"
    assert all(choose_kernel("cpu", kernel) == choose_kernel("cuda", kernel) == kernel for kernel in rel_pos.KERNELS)
    for call in (lambda: choose_kernel("cpu", "fast"), lambda: rel_pos_attention(*inputs("global")[0], (5, 7),
                                                                                 kernel="fast")):
        with pytest.raises(ValueError, match=r"unknown relative-position kernel 'fast'.*choose one of "
                                             r"\('blocked', 'folded', 'bias', 'flex'\)"):
            call()


def test_a_model_passes_its_kernel_to_every_attention_call():
    """``SRViT(rel_pos_kernel=...)`` runs that kernel in every relative-position application
    (``flex``, which has no backward on the CPU, fails a training step there; ``folded`` trains
    and equals the CPU's own kernel); a name that is not a kernel, or a kernel without relative
    positions, is refused when the model is built."""
    def tiny(**kwargs):
        torch.manual_seed(0)
        return SRViT(img_size=64, embed_dim=32, num_heads=2, layout=(2, 1), num_steps=2, num_classes=0,
                     window_size=2, **kwargs)

    x = torch.randn(2, 3, 64, 64)
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        tiny(use_rel_pos=True, rel_pos_kernel="flex").forward_features(x)
    with torch.no_grad():
        assert tiny(use_rel_pos=True, rel_pos_kernel="flex").forward_features(x).isfinite().all()
    default, folded = tiny(use_rel_pos=True), tiny(use_rel_pos=True, rel_pos_kernel="folded")
    for model in (default, folded):
        torch.manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.2)
    torch.testing.assert_close(folded.forward_features(x), default.forward_features(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown relative-position kernel 'fast'"):
        tiny(use_rel_pos=True, rel_pos_kernel="fast")
    with pytest.raises(ValueError, match="rel_pos_kernel='bias' chooses the relative-position attention's kernel, "
                                         "and this model has none: use use_rel_pos=True, or rel_pos_kernel=None"):
        tiny(rel_pos_kernel="bias")


@pytest.mark.parametrize("grid,window", [((5, 7), 0), ((6, 6), 3), ((6, 7), 4)],
                         ids=["global", "windows", "padded_windows"])
def test_the_folded_kernel_equals_detectron2_in_float64(grid, window):
    """``folded`` against detectron2's formula in float64, where only the arithmetic's order can
    differ: the output and the gradients of q, k, v and both tables to 1e-10, on a global grid,
    on whole windows and on windows of a padded grid (``window_qkv``'s zero tokens attend as
    ViTDet's do)."""
    from srvit_backbones.models.window import window_qkv

    heads, C = 2, 8
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, grid[0] * grid[1], 3 * heads * C, generator=g, dtype=torch.float64)
    if window:
        q, k, v = window_qkv(qkv, torch.randn(3 * heads * C, generator=g, dtype=torch.float64), grid, window,
                             heads)
    else:
        q, k, v = qkv.view(2, -1, 3, heads, C).permute(2, 0, 3, 1, 4).unbind(0)
    size = (window, window) if window else grid
    tables = [torch.randn(2 * n - 1, C, generator=g, dtype=torch.float64) for n in size]
    tensors = [t.contiguous().requires_grad_() for t in (q, k, v)] + [t.requires_grad_() for t in tables]
    got = rel_pos_attention(*tensors, size, kernel="folded")
    expected = detectron2_attention(*tensors, size)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    for a, b in zip(grads_of(got, tensors), grads_of(expected, tensors)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_the_folded_kernels_head_dims_are_aligned_for_the_fused_kernels():
    """q.k carries the channels and one term per key row and column, aligned to 8; v keeps its
    own head dim while q.k fits cuDNN's training (128), beyond it takes q.k's (flash's rule)."""
    assert rel_pos.folded_head_dims(64, (14, 14)) == (96, 64)
    assert rel_pos.folded_head_dims(64, (64, 64)) == (192, 192)
    assert rel_pos.folded_head_dims(8, (5, 7)) == (24, 8)
    assert rel_pos.folded_head_dims(6, (3, 3)) == (16, 8)


def test_the_bias_kernel_takes_a_few_calls_of_whole_maps_at_any_batch():
    """The GPU's rule at ViTDet's geometry (1024, 6 heads): 14x14 windows in one call up to 23
    images (5.8M elements each) and a few beyond, never a call per grid row; the global 64x64 grid
    (16.8M elements per head) in one call at batch 1, then calls of 8 maps (12 at batch 16): at
    most GPU_BIAS_ELEMENTS per call, at least one map."""
    window_maps, global_maps = 25 * 6, 6  # per image
    assert [bias_calls(images * window_maps, 196, 196) for images in (1, 2, 16, 23, 24, 64)] == [1, 1, 1, 1, 2, 3]
    assert [bias_calls(images * global_maps, 4096, 4096) for images in (1, 2, 16)] == [1, 2, 12]
    assert bias_calls(7, 10, 10, budget=1) == 7 and bias_calls(7, 10, 10, budget=350) == 3


def test_the_bias_kernel_keeps_its_bias_only_within_the_budget(monkeypatch):
    """Memory: one call keeps its whole (maps, queries, keys) bias for the backward; beyond
    GPU_BIAS_ELEMENTS the calls are checkpointed and nothing of (queries, keys) size is kept, in
    fp32 and fp16."""
    tensors, size = inputs("global")
    bias_elements = 2 * 2 * 35 * 35  # images x heads x queries x keys

    def largest_saved(dtype):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            rel_pos_attention(*[t.detach().to(dtype).requires_grad_() for t in tensors], size, device_type="cuda",
                              kernel="bias")
        return max(sizes)

    assert largest_saved(torch.float32) >= bias_elements  # within the budget: the whole bias, kept
    monkeypatch.setattr(rel_pos, "GPU_BIAS_ELEMENTS", bias_elements // 2)
    for dtype in (torch.float32, torch.float16):
        assert largest_saved(dtype) <= tensors[0].numel()  # q, k, v, the per-axis terms


def training_step_launches(images, grid, device, **kwargs):
    """The launches of one training step of one application with the GPU's choices (forward,
    then the backward from a given output gradient; the constants made before), fp32, counted
    op by op as the CPU dispatches them (tests/test_cuda_dispatch.py counts what CUDA would run)."""
    n = grid[0] * grid[1]
    new = torch.randn if device == "cpu" else torch.empty
    tensors = [new(images, 6, n, 64, device=device).requires_grad_() for _ in range(3)]
    tensors += [new(2 * side - 1, 64, device=device).requires_grad_() for side in grid]
    grad_out = new(images, 6, n, 64, device=device)

    def step():
        out = rel_pos_attention(*tensors, grid, device_type="cuda", **kwargs)
        torch.autograd.grad(out, tensors, grad_out)

    step()
    return count_launches(step)


def test_launches_counted_on_meta_tensors_are_the_cpus():
    """What the meta device counts is what the CPU runs, for the GPU's kernels (``folded``, and
    ``bias`` with its chunked calls)."""
    for kernel, block_elements in (("folded", None), ("bias", None), ("bias", 200)):
        assert training_step_launches(3, (5, 4), "meta", kernel=kernel, block_elements=block_elements).ops == \
            training_step_launches(3, (5, 4), "cpu", kernel=kernel, block_elements=block_elements).ops


@pytest.mark.parametrize("kernel,device_type,block_elements", [("blocked", "cpu", 2 * 2 * 2 * 7 * 35),
                                                                ("bias", "cuda", 2500), ("folded", "cuda", None)],
                         ids=["blocked_row_blocks", "bias_in_calls", "folded"])
def test_a_training_step_compiles_without_a_graph_break(kernel, device_type, block_elements):
    """``torch.compile(fullgraph=True)`` (a graph break is an error) of the forward and its
    backward with blocks of grid rows (the CPU's global grid at 1024 takes them; here blocks of 2
    rows of both images), with the ``bias`` calls of whole maps (2 here) and with ``folded``:
    eager's output and gradients to 1e-5."""
    import torch._dynamo

    tensors, size = inputs("global")
    if kernel == "blocked":
        assert rel_pos._query_blocks(2, 2, 5, 7, 35, block_elements)[1] == (slice(0, 2), slice(2, 4))
    elif kernel == "bias":
        assert bias_calls(2 * 2, 35, 35, block_elements) == 2

    def forward(*t):
        return rel_pos_attention(*t, size, kernel=kernel, device_type=device_type, block_elements=block_elements)

    torch._dynamo.reset()
    compiled = torch.compile(forward, backend="aot_eager", fullgraph=True)(*tensors)
    eager = forward(*tensors)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_of(compiled, tensors), grads_of(eager, tensors)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_blocks_of_grid_rows_span_several_images():
    """Where an image's scores do not fit a block, a block takes the same rows of as many images
    as fit (fewer launches on a GPU), and the result is unchanged."""
    per_row = 2 * 7 * 35  # heads x row length x keys
    assert rel_pos._query_blocks(3, 2, 5, 7, 35, 4 * per_row) == [(slice(0, 3), slice(r, r + 1)) for r in range(5)]
    assert rel_pos._query_blocks(3, 2, 5, 7, 35, 2 * per_row)[:3] == [(slice(0, 2), slice(r, r + 1)) for r in range(3)]
    tensors, size = inputs("global")
    got = rel_pos_attention(*tensors, size, kernel="blocked", block_elements=2 * per_row)
    torch.testing.assert_close(got, detectron2_attention(*tensors, size), rtol=1e-5, atol=1e-5)


def test_the_relative_index_is_made_once_per_extent_on_the_tables_device():
    """No host index per call: the offsets of an extent are made once, on the table's device
    (a meta table gets a meta index, so nothing was made on the host)."""
    rel_pos._cached_offsets.cache_clear()
    table = torch.randn(13, 4)
    first, again = rel_pos_lookup(7, table), rel_pos_lookup(7, table)
    assert torch.equal(first, again) and rel_pos._cached_offsets.cache_info().misses == 1
    assert rel_pos_lookup(7, torch.empty(13, 4, device="meta")).device.type == "meta"
    assert rel_pos._cached_offsets.cache_info().misses == 2
    from timm.models.vision_transformer_sam import get_rel_pos

    rel_pos._cached_offsets.cache_clear()
    with torch.inference_mode():  # evaluation first, then training: the cached index serves both
        rel_pos_lookup(7, table)
    trained = table.clone().requires_grad_()
    rel_pos_lookup(7, trained).sum().backward()
    assert trained.grad is not None
    for rows in (13, 5, 21):  # its own length, and tables interpolated to 13 rows
        t = torch.randn(rows, 4)
        torch.testing.assert_close(rel_pos_lookup(7, t), get_rel_pos(7, 7, t))


def test_every_block_of_a_windowed_model_runs_as_a_timm_block():
    """``block(x)`` (timm ``Block.forward``, ``attn(x, attn_mask=None)``) works on every block:
    on a square grid it attends as the block's own applications do (globally where it has global
    tables, else in its windows); a grid that is not square is refused, naming ``grid``."""
    torch.manual_seed(0)
    model = SRViT(img_size=64, patch_size=16, embed_dim=32, num_heads=2, layout=(2, 1), num_steps=2,
                  window_size=2, use_rel_pos=True).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    x = torch.randn(2, 16, 32)
    seen = set()
    for unit, apps in enumerate(model.units):
        for j, block in enumerate(apps.blocks):
            window, has_global = model.schedule.extents(unit, j)
            own = 0 if has_global else window
            seen.add(own)
            with torch.no_grad():
                torch.testing.assert_close(block(x), apply_block(block, x, 0.0, False, (4, 4), own))
    assert seen == {0, 2}
    with pytest.raises(ValueError, match="15 tokens do not form a square patch grid: pass grid"):
        model.units[0].blocks[0].attn(torch.randn(1, 15, 32))
