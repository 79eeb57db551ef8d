"""ViTDet-style options of the core: window attention per block application, decomposed
relative positions, no class token in that mode; the default stays the paper's model."""
import re
from functools import partial

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from timm.models.vision_transformer_sam import Block as SamBlock
from timm.models.vision_transformer_sam import get_rel_pos

from helpers import unit_applications
from srvit_backbones import CheckpointError, SoftMoRUnit, SRViT, create_srvit, load_pretrained
from srvit_backbones.analysis.flops import count_flops
from srvit_backbones.layer_decay import layer_id
from srvit_backbones.models import RelPosAttention, apply_block, default_global_attn_indexes
from srvit_backbones.models.rel_pos import is_rel_pos, resize_rel_pos
from srvit_backbones.models.window import merge_windows, window_qkv


def tiny(**kw):
    args = dict(img_size=64, patch_size=16, embed_dim=32, num_heads=2, layout=(2, 1), num_steps=3, num_classes=5)
    args.update(kw)
    return SRViT(**args)


def randomized(model, seed=0):
    """Every parameter non-zero (relative-position tables, router, step transforms included)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


# ----------------------------------------------------------------------------- default rule and options
def test_default_global_applications():
    """The first application of each unit feeding the dense heads, and the last application:
    ViTDet's global blocks 2, 5, 8, 11 for the DeiT layout."""
    assert default_global_attn_indexes((1,) * 10, 1) == (2, 5, 8, 11)
    assert default_global_attn_indexes((4, 3, 2, 1), 3) == (1, 13, 22, 28, 31)
    assert default_global_attn_indexes((3, 2, 1), 3) == (1, 10, 16, 19)
    model = create_srvit("srvit_s_t3", img_size=64, embed_dim=32, num_heads=2, num_classes=0, window_size=14)
    windows = [w for unit in model.units for w in unit.window_sizes]
    assert [i for i, w in enumerate(windows) if w == 0] == [1, 13, 22, 28, 31]
    assert len(windows) == model.effective_depth == 32 and set(windows) == {0, 14}
    assert model.global_attn_indexes == (1, 13, 22, 28, 31)


def test_global_applications_are_configurable_and_tables_follow_the_applications():
    """A block gets a window table if one of its applications is windowed, a global table if
    one is global: units.1 (K=2, T=3) applies block 0 at 1, 3, 5 and block 1 at 2, 4, 6."""
    model = tiny(window_size=2, use_rel_pos=True, global_attn_indexes=(0, 3))
    assert [u.window_sizes for u in model.units] == [[0], [2, 2, 0, 2, 2, 2], [2, 2, 2], [2]]
    tables = {n for n, _ in model.named_parameters() if is_rel_pos(n)}
    assert tables == {f"units.{u}.blocks.{k}.attn.{kind}_rel_pos_{a}" for u, k, kind in
                      [(0, 0, "global"), (1, 0, "window"), (1, 0, "global"), (1, 1, "window"),
                       (2, 0, "window"), (3, 0, "window")] for a in "hw"}
    attn = model.units[1].blocks[0].attn
    assert attn.window_rel_pos_h.shape == (2 * 2 - 1, 16) and attn.global_rel_pos_w.shape == (2 * 4 - 1, 16)
    assert all(p.abs().sum() == 0 for n, p in model.named_parameters() if is_rel_pos(n))  # zero-initialised
    assert tiny(window_size=0).global_attn_indexes == tuple(range(11))


# ----------------------------------------------------------------------------- semantics
def _global_twin(windowed: SRViT, **kw) -> SRViT:
    """The same weights with every application global (window tables -> global tables)."""
    twin = tiny(global_attn_indexes=range(windowed.effective_depth), **kw)
    twin.load_state_dict({k.replace("window_rel_pos", "global_rel_pos"): v for k, v in windowed.state_dict().items()})
    return twin


@pytest.mark.parametrize("use_rel_pos", [False, True], ids=["abs_pos", "rel_pos"])
def test_window_covering_the_grid_equals_global_attention(use_rel_pos):
    """One 4x4 window over the 4x4 grid of a 64x64 image is global attention. Both models
    carry no class token (windowed mode), so both attend over the same 16 patch tokens and
    every output token is a patch token; a class-token model could not be compared, its
    class token takes part in every attention."""
    kw = dict(window_size=4, use_rel_pos=use_rel_pos)
    windowed = randomized(tiny(global_attn_indexes=(), **kw)).eval()
    assert all(w == 4 for u in windowed.units for w in u.window_sizes)
    twin = _global_twin(windowed, **kw).eval()
    assert all(w == 0 for u in twin.units for w in u.window_sizes)
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(windowed.forward_features(x), twin.forward_features(x))
    a, b = windowed.forward_feature_maps(x, return_mixture=True), twin.forward_feature_maps(x, return_mixture=True)
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=key)
    # and it is not the same function once the windows split the grid (2x2 windows)
    split = tiny(window_size=2, use_rel_pos=use_rel_pos, global_attn_indexes=()).eval()
    split.load_state_dict({k: v for k, v in windowed.state_dict().items() if not is_rel_pos(k)}, strict=False)
    assert not torch.allclose(split.forward_features(x), twin.forward_features(x), atol=1e-3)


@pytest.mark.parametrize("window,use_rel_pos", [(3, True), (0, True), (3, False)],
                         ids=["windowed", "global", "windowed_no_rel_pos"])
def test_block_application_matches_timm_vitdet_block(window, use_rel_pos):
    """Against timm's SAM block, ViTDet's design (window_partition with zero padding before the
    qkv projection, decomposed relative positions): a 5x7 grid in 3x3 windows is padded to 6x9."""
    model = randomized(tiny(window_size=3, use_rel_pos=use_rel_pos))
    block = model.units[1].blocks[0]  # applied windowed and global: holds both table pairs
    ref = SamBlock(32, 2, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6), use_rel_pos=use_rel_pos,
                   window_size=window, input_size=(5, 7))
    kind = "window" if window else "global"
    sd = {re.sub(rf"attn\.{kind}_rel_pos", "attn.rel_pos", k): v for k, v in block.state_dict().items()
          if not is_rel_pos(k) or kind in k}
    if not window:  # the model's global tables are for its 4x4 grid: resize them for 5x7 as ViTDet would
        sd = {k: resize_rel_pos(v, 2 * (5 if k.endswith("_h") else 7) - 1) if is_rel_pos(k) else v
              for k, v in sd.items()}
    ref.load_state_dict(sd)
    x = torch.randn(2, 5 * 7, 32)
    out = apply_block(block, x, 0.0, False, grid=(5, 7), window_size=window)
    expected = ref(x.view(2, 5, 7, 32)).view(2, 35, 32)
    torch.testing.assert_close(out, expected)
    # and the gradients: the qkv bias also gets those of the padded tokens, whose projection it
    # is (the global tables are compared forward only: ViTDet got them already resized)
    grad = torch.randn_like(out)
    (out * grad).sum().backward()
    (expected * grad).sum().backward()
    ref_grads = {name: p.grad for name, p in ref.named_parameters()}
    for name, p in block.named_parameters():
        if not is_rel_pos(name) or name.startswith("attn.window_") and window:
            torch.testing.assert_close(p.grad, ref_grads[re.sub(r"attn\.window_rel_pos", "attn.rel_pos", name)],
                                       msg=name)


def test_window_padding_round_trips_and_windows_are_local():
    """5x7 tokens in 3x3 windows: padded to 6x9 (2x3 windows) with the qkv bias (the projection
    of ViTDet's zero padding), exact round trip; an input change inside one window changes the
    outputs of that window only."""
    heads, C = 2, 2
    qkv, bias = torch.randn(2, 5 * 7, 3 * heads * C), torch.randn(3 * heads * C)
    windows = torch.stack(window_qkv(qkv, bias, (5, 7), 3, heads))
    assert windows.shape == (3, 2 * 2 * 3, heads, 9, C)
    per_head = qkv.view(2, 5, 7, 3, heads, C).permute(3, 0, 4, 1, 2, 5)  # (q/k/v, image, head, row, col, C)
    as_grid = windows.view(3, 2, 6, heads, 3, 3, C)                          # (q/k/v, image, window, head, 3, 3, C)
    assert torch.equal(as_grid[:, 0, 0], per_head[:, 0, :, :3, :3])          # first window: rows 0-2, cols 0-2
    assert torch.equal(as_grid[:, 0, 5, :, :2, :1], per_head[:, 0, :, 3:, 6:])  # last window of image 0
    last = as_grid[:, 0, 5]                                                   # (q/k/v, head, row, col, C)
    assert (last[:, :, 2] == bias.view(3, heads, 1, C)).all()          # bottom padding row
    assert (last[:, :, :, 1:] == bias.view(3, heads, 1, 1, C)).all()   # right padding columns
    for i in range(3):
        unwindowed = per_head[i].permute(0, 2, 3, 1, 4).reshape(2, 35, heads * C)
        assert torch.equal(merge_windows(windows[i], (5, 7), 3), unwindowed)
    last = torch.stack(window_qkv(qkv, None, (5, 7), 3, heads)).view(3, 2, 6, heads, 3, 3, C)[:, 0, 5]  # no bias: zeros
    assert (last[:, :, 2] == 0).all() and (last[:, :, :, 1:] == 0).all()

    block = randomized(tiny(window_size=3, use_rel_pos=True)).units[1].blocks[1]  # windowed only
    tokens = torch.randn(1, 35, 32)
    moved = tokens.clone()
    moved[0, 7 * 4 + 6] += 1.0  # row 4, col 6: the window of rows 3-5, cols 6-8
    changed = (apply_block(block, moved, 0.0, False, (5, 7), 3) - apply_block(block, tokens, 0.0, False, (5, 7), 3))
    changed = changed.abs().sum(-1).view(5, 7) > 0
    expected = torch.zeros(5, 7, dtype=torch.bool)
    expected[3:, 6:] = True
    assert torch.equal(changed, expected)


def test_windowed_model_carries_no_class_token_and_pools_patch_tokens():
    model = randomized(tiny(window_size=2, use_rel_pos=True)).eval()
    assert model.cls_token is None and model.num_prefix_tokens == 0 and model.global_pool == "avg"
    assert model.pos_embed.shape == (1, 16, 32)
    x = torch.randn(2, 3, 64, 80)
    feats = model.forward_features(x)
    assert feats.shape == (2, 4 * 5, 32)
    torch.testing.assert_close(model(x), model.head(feats.mean(1)))
    final, inter = model.forward_intermediates(x, indices=[1, 2], return_prefix_tokens=True)
    assert final.shape == (2, 20, 32) and inter[0][0].shape == (2, 32, 4, 5) and inter[0][1].shape == (2, 0, 32)
    backbone = timm.create_model("srvit_s_t2", img_size=64, embed_dim=32, num_heads=2, features_only=True,
                                 window_size=2, use_rel_pos=True)
    assert [f.shape for f in backbone(x)] == [(2, 32, 4, 5)] * 4


# ----------------------------------------------------------------------------- training
def test_gradients_reach_every_parameter_in_windowed_mode():
    """Zero-initialised tables, router and step transforms included; a grid that is not a
    multiple of the window (5x3 in 2x2 windows) and not the model's (4x4: the global tables
    are interpolated at run time). Checkpointed applications give the same gradients."""
    model = tiny(window_size=2, use_rel_pos=True, drop_path_rate=0.1)
    ref = tiny(window_size=2, use_rel_pos=True, drop_path_rate=0.1)
    ref.load_state_dict(model.state_dict())
    model.set_grad_checkpointing(True)
    x = torch.randn(2, 3, 80, 48)
    losses = []
    for m in (model, ref):
        torch.manual_seed(0)
        feats = m.forward_feature_maps(x, return_mixture=True)
        losses.append(m(x).square().sum() + sum(f.square().mean() for f in feats.values()))
        losses[-1].backward()
    torch.testing.assert_close(losses[0], losses[1])
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert any(is_rel_pos(n) for n, _ in model.named_parameters())


def test_layer_decay_ids_and_weight_decay_of_the_tables():
    """A table is its block's parameter: the block's layer id; no weight decay (a position)."""
    from timm.optim import create_optimizer_v2

    model = create_srvit("srvit_s_t3", img_size=64, embed_dim=32, num_heads=2, num_classes=4, window_size=2,
                         use_rel_pos=True)
    sizes = model.unit_sizes
    tables = [n for n, _ in model.named_parameters() if is_rel_pos(n)]
    assert len(tables) == 2 * (11 + 5)  # 11 blocks have a windowed application, 5 a global one (the last: only)
    for name in tables:
        block = name.split(".attn.")[0]
        assert layer_id(name, sizes) == layer_id(f"{block}.attn.qkv.weight", sizes) >= 1, name
    assert layer_id("units.1.blocks.0.attn.global_rel_pos_h", sizes) == 2
    assert layer_id("units.2.blocks.2.attn.window_rel_pos_w", sizes) == 8
    assert set(tables) <= model.no_weight_decay()
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.7)
    params = dict(model.named_parameters())
    for group in opt.param_groups:
        for p in group["params"]:
            name = next(n for n, q in params.items() if q is p)
            if is_rel_pos(name):
                assert group["weight_decay"] == 0.0 and group["lr_scale"] == pytest.approx(
                    0.7 ** (sum(sizes) + 1 - layer_id(name, sizes))), name


# ----------------------------------------------------------------------------- checkpoints
def test_checkpoint_round_trip(tmp_path):
    a = randomized(tiny(window_size=2, use_rel_pos=True)).eval()
    b = tiny(window_size=2, use_rel_pos=True).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 80, 48)
    assert torch.equal(a(x), b(x))
    torch.save({"model": a.state_dict()}, tmp_path / "win.pth")
    c = tiny(window_size=2, use_rel_pos=True).eval()
    report = load_pretrained(c, str(tmp_path / "win.pth"))
    assert report.complete and not report.dropped
    assert torch.equal(a(x), c(x))


def test_rel_pos_tables_of_another_size_are_resized_on_load():
    """Window 2 -> 3 and grid 4x4 -> 6x6: detectron2's linear interpolation, so the loaded
    table gives the bias get_rel_pos would compute from the original at run time."""
    src = randomized(tiny(window_size=2, use_rel_pos=True))
    dst = tiny(img_size=96, window_size=3, use_rel_pos=True)
    report = load_pretrained(dst, src.state_dict())
    assert report.complete
    assert any("units.1.blocks.0.attn.window_rel_pos_h resized 3 -> 5 rows" in n for n in report.notes)
    for name, table in dst.named_parameters():
        if is_rel_pos(name):
            old = src.state_dict()[name]
            expected = F.interpolate(old.T[None], size=table.shape[0], mode="linear")[0].T
            torch.testing.assert_close(table.data, expected, msg=name)
            size = (table.shape[0] + 1) // 2
            torch.testing.assert_close(get_rel_pos(size, size, table.data), get_rel_pos(size, size, old), msg=name)


def test_global_checkpoint_into_a_windowed_rel_pos_model(tmp_path, caplog):
    """The usual fine-tuning start (ImageNet weights have a class token and no tables): the
    class token and its position entry are dropped, the new tables are named and stay zero;
    a really missing block weight is still refused."""
    src = randomized(tiny(num_classes=0))
    sd = src.state_dict()
    model = tiny(num_classes=0, window_size=2, use_rel_pos=True)
    with caplog.at_level("INFO"):
        report = load_pretrained(model, dict(sd))
    assert report.dropped == ["cls_token"] and not report.required_missing and not report.unexpected
    assert report.missing and all(is_rel_pos(k) for k in report.missing)
    assert "new relative-position tables, left at zero: 14 tensors: units.{0,1,2}.blocks.*.attn.window_rel_pos_h (4)" \
        in caplog.text and "units.{1,2,3}.blocks.*.attn.global_rel_pos_w (3)" in caplog.text
    assert "pos_embed prefix tokens 1 -> 0" in " ".join(report.notes)
    assert torch.equal(model.pos_embed, sd["pos_embed"][:, 1:])
    assert torch.equal(model.units[1].blocks[1].mlp.fc1.weight, sd["units.1.blocks.1.mlp.fc1.weight"])
    assert all(p.abs().sum() == 0 for n, p in model.named_parameters() if is_rel_pos(n))

    del sd["units.2.blocks.0.attn.qkv.weight"]
    with pytest.raises(CheckpointError, match=r"does not hold 1 of.*\n  units\.2\.blocks\.\*\n"):
        load_pretrained(tiny(num_classes=0, window_size=2, use_rel_pos=True), dict(sd))
    # timm loads strictly when the classifier is kept: the new tables must not break that
    torch.save(randomized(create_srvit("srvit_s_t2", img_size=32, embed_dim=32, num_heads=2)).state_dict(),
               tmp_path / "cls.pth")
    timm.create_model("srvit_s_t2", img_size=32, embed_dim=32, num_heads=2, window_size=2, use_rel_pos=True,
                      pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "cls.pth")))
    # the other way round cannot work: a class-token model from a checkpoint without one
    with pytest.raises(CheckpointError, match="no class-token entry.*window_size / use_rel_pos"):
        load_pretrained(tiny(), tiny(window_size=2).state_dict())


# ----------------------------------------------------------------------------- default unchanged
def test_default_is_the_global_class_token_model_bit_for_bit():
    """window_size=0 is today's model: built without the new arguments or with their
    defaults, the same parameters, no table, a class token, and outputs equal bit for bit;
    at T=1 bit for bit timm's own VisionTransformer with the same weights."""
    torch.manual_seed(0)
    plain = tiny()
    torch.manual_seed(0)
    explicit = tiny(window_size=0, global_attn_indexes=None, use_rel_pos=False, global_pool="token")
    assert plain.state_dict().keys() == explicit.state_dict().keys()
    assert all(torch.equal(v, explicit.state_dict()[k]) for k, v in plain.state_dict().items())
    assert plain.cls_token is not None and plain.num_prefix_tokens == 1 and plain.global_pool == "token"
    assert not any(isinstance(m, RelPosAttention) for m in plain.modules())
    assert all(w == 0 for u in plain.units for w in u.window_sizes)
    x = torch.randn(2, 3, 64, 48)
    assert torch.equal(randomized(plain).eval()(x), randomized(explicit).eval()(x))

    vit = VisionTransformer(img_size=32, patch_size=16, embed_dim=32, depth=12, num_heads=2,
                                        num_classes=5).eval()
    deit = tiny(img_size=32, layout=(1,) * 10, num_steps=1).eval()
    assert load_pretrained(deit, vit.state_dict()).complete
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(deit(x), vit(x))


# ----------------------------------------------------------------------------- cost
def test_windowed_attention_costs_fewer_flops_at_1024():
    """64x64 tokens, width 32: a global application's attention counts 2 * 4096^2 * 32
    multiply-adds, a 14x14-windowed one 2 * 25 * 196^2 * 32 (the grid padded to 70x70);
    the difference is the whole gap between the counts, within 1% (padding adds linear cost)."""
    x = torch.randn(1, 3, 1024, 1024)
    args = dict(img_size=1024, embed_dim=32, num_heads=2, layout=(1,), num_steps=2, num_classes=0)
    flops = {name: count_flops(SRViT(**args, **kw), (x,)) for name, kw in [
        ("global", {}), ("default", dict(window_size=14)), ("windowed", dict(window_size=14, global_attn_indexes=()))]}
    assert flops["windowed"] < flops["default"] < flops["global"]
    saving_per_application = 2 * 4096 ** 2 * 32 - 2 * 25 * 196 ** 2 * 32
    assert flops["global"] - flops["windowed"] == pytest.approx(4 * saving_per_application, rel=0.01)
    assert flops["global"] - flops["default"] == pytest.approx(2 * saving_per_application, rel=0.01)  # 2 of 4 global


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs,match", [
    (dict(window_size=-1), r"window_size must be an integer >= 0 \(0 = global attention"),
    (dict(window_size=2.5), r"window_size must be an integer >= 0"),
    (dict(window_size=2, global_attn_indexes=(3, 11)),
     r"global_attn_indexes \[11\] out of range: .* 11 times, numbered 0\.\.10 .*or None for the default"),
    (dict(window_size=2, global_attn_indexes=(-1,)), r"global_attn_indexes \[-1\] out of range"),
    (dict(window_size=2, global_pool="token"), r"global_pool='token' needs the class token.*use global_pool='avg'"),
    (dict(use_rel_pos=True, distilled=True), r"distilled=True needs the class and distillation tokens.*window_size=0"),
])
def test_bad_window_arguments_name_the_argument_and_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kwargs)


def test_windowed_unit_without_the_grid_is_a_clear_error():
    unit = SoftMoRUnit(tiny(window_size=2).units[1].blocks, unit_applications(2, 1, window_sizes=[2, 2]))
    with pytest.raises(ValueError, match=r"need the patch grid: call the unit as unit\(x, grid=\(h, w\)\)"):
        unit(torch.randn(1, 16, 32))
    with pytest.raises(ValueError, match="17 tokens do not form the 4x4 patch grid.*no class token"):
        unit(torch.randn(1, 17, 32), grid=(4, 4))
    with pytest.raises(ValueError, match=r"window_size must be an integer >= 0"):
        unit_applications(2, 1, window_sizes=[2, -2])
    with pytest.raises(ValueError, match=r"runs each block once per step, in order: .* got \[\(0, 1\), \(0, 0\)\]"):
        SoftMoRUnit(tiny().units[1].blocks, unit_applications(2, 1)[::-1])


def _whole_bias_attention(q, k, v, rel_h, rel_w, size):
    """timm's (detectron2's) reference: the whole (queries, keys) bias, then SDPA."""
    from timm.models.vision_transformer_sam import get_decomposed_rel_pos_bias

    B, heads, N, C = q.shape
    bias = get_decomposed_rel_pos_bias(q.reshape(B * heads, N, C), rel_h, rel_w, size, size)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.view(B, heads, N, N))


# budgets in scores: one grid row of one image (35 * 5 * 3), a few rows, two whole images of
# three (blocks across the batch), everything at once
@pytest.mark.parametrize("budget", [1, 3 * 5 * 35 * 2, 2 * 3 * 35 * 35, 10 ** 9])
@pytest.mark.parametrize("grad", [True, False], ids=["train", "infer"])
def test_blocked_relative_position_attention_equals_the_whole_bias(budget, grad):
    """Queries in blocks of whole grid rows and images give timm's whole-bias attention, in
    inference and through the recomputing backward (``_BlockedRelPosAttention``), also with a table of
    another length (interpolated)."""
    from srvit_backbones.models.rel_pos import rel_pos_attention

    torch.manual_seed(0)
    B, heads, h, w, C = 3, 3, 7, 5, 8
    q, k, v = (torch.randn(B, heads, h * w, C, requires_grad=grad) for _ in range(3))
    for rel_h, rel_w in [(torch.randn(2 * h - 1, C), torch.randn(2 * w - 1, C)),
                         (torch.randn(5, C), torch.randn(27, C))]:
        rel_h.requires_grad_(grad), rel_w.requires_grad_(grad)
        expected = _whole_bias_attention(q, k, v, rel_h, rel_w, (h, w))
        got = rel_pos_attention(q, k, v, rel_h, rel_w, (h, w), 0.0, budget)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        if grad:
            assert got.grad_fn.name() == "_BlockedRelPosAttentionBackward"
            weights = torch.randn_like(expected)
            grads = torch.autograd.grad((expected * weights).sum(), (q, k, v, rel_h, rel_w))
            for a, b in zip(torch.autograd.grad((got * weights).sum(), (q, k, v, rel_h, rel_w)), grads):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_relative_position_attention_backward_passes_gradcheck():
    """The hand-written backward against finite differences (float64), over several blocks."""
    from srvit_backbones.models.rel_pos import rel_pos_attention

    torch.manual_seed(0)
    B, heads, h, w, C = 2, 2, 3, 4, 4
    inputs = [torch.randn(B, heads, h * w, C, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    inputs += [torch.randn(2 * h - 1, C, dtype=torch.float64, requires_grad=True),
               torch.randn(2 * w - 1, C, dtype=torch.float64, requires_grad=True)]
    budget = heads * w * h * w  # one grid row of one image per block
    assert torch.autograd.gradcheck(lambda *t: rel_pos_attention(*t, (h, w), 0.0, budget), inputs)


def test_relative_position_attention_over_a_large_grid_takes_sdpa_and_equals_the_whole_bias():
    """Grids of SDPA_MIN_KEYS keys and more take SDPA with a bias per block, fewer
    matmul-softmax-matmul on the CPU: both equal the reference, forward and backward."""
    from srvit_backbones.models.rel_pos import SDPA_MIN_KEYS, rel_pos_attention

    torch.manual_seed(0)
    side = int(SDPA_MIN_KEYS ** 0.5)
    assert side * side == SDPA_MIN_KEYS
    q, k, v = (torch.randn(1, 2, side * side, 8, requires_grad=True) for _ in range(3))
    rel_h, rel_w = (torch.randn(2 * side - 1, 8).mul_(0.3).requires_grad_() for _ in range(2))
    expected = _whole_bias_attention(q, k, v, rel_h, rel_w, (side, side))
    with torch.no_grad():
        torch.testing.assert_close(rel_pos_attention(q, k, v, rel_h, rel_w, (side, side), 0.0, 2 * side * side * 4),
                                   expected, rtol=1e-5, atol=1e-6)
    got = rel_pos_attention(q, k, v, rel_h, rel_w, (side, side), 0.0, 2 * side * side * 4)
    grads = torch.autograd.grad(expected.square().sum(), (q, k, v, rel_h, rel_w))
    for a, b in zip(torch.autograd.grad(got.square().sum(), (q, k, v, rel_h, rel_w)), grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_relative_position_attention_with_dropout_takes_autograd_through_the_kernel():
    """Attention dropout is differentiated by autograd block by block: dropout is applied
    (outputs change, gradients reach every input); low precision keeps the recomputing backward
    and returns gradients in its own dtype, close to fp32's."""
    from srvit_backbones.models.rel_pos import rel_pos_attention

    torch.manual_seed(0)
    h, w = 6, 5
    inputs = [torch.randn(2, 2, h * w, 8, requires_grad=True) for _ in range(3)]
    inputs += [torch.randn(2 * h - 1, 8, requires_grad=True), torch.randn(2 * w - 1, 8, requires_grad=True)]
    plain = rel_pos_attention(*inputs, (h, w), 0.0, 2 * w * h * w)
    dropped = rel_pos_attention(*inputs, (h, w), 0.5, 2 * w * h * w)
    assert dropped.grad_fn.name() != "_BlockedRelPosAttentionBackward"
    assert not torch.allclose(dropped, plain)
    assert all(g.abs().sum() > 0 for g in torch.autograd.grad(dropped.sum(), inputs))
    for dtype in (torch.bfloat16, torch.float16):
        low = [t.detach().to(dtype).requires_grad_() for t in inputs]
        out = rel_pos_attention(*low, (h, w), 0.0, 2 * w * h * w)
        assert out.dtype == dtype and out.grad_fn.name() == "_BlockedRelPosAttentionBackward"
        torch.testing.assert_close(out.float(), plain, rtol=0.05, atol=0.05)
        low_grads = torch.autograd.grad(out.float().square().sum(), low)
        for g, _t, ref in zip(low_grads, low, torch.autograd.grad(plain.square().sum(), inputs, retain_graph=True)):
            assert g.dtype == dtype
            assert F.cosine_similarity(g.float().flatten(), ref.flatten(), dim=0) > 0.99


def test_the_recomputing_function_takes_one_dtype_and_ignores_autocast():
    """``_BlockedRelPosAttention`` refuses inputs of mixed dtypes (a saved fp32 q next to an fp16 k
    would be recomputed wrong); ``rel_pos_attention`` casts them to autocast's dtype, and a
    backward run inside the autocast region (on the CPU it runs in the caller's thread) gives
    the gradients of the autocast-free computation in the inputs' dtypes."""
    from srvit_backbones.models.rel_pos import _BlockedRelPosAttention, rel_pos_attention

    torch.manual_seed(0)
    h, w = 4, 5
    q, k, v = (torch.randn(1, 2, h * w, 8, requires_grad=True) for _ in range(3))
    terms = [torch.randn(1, 2, h, w, h), torch.randn(1, 2, h, w, w)]
    with pytest.raises(TypeError, match="inputs of one dtype.*rel_pos_attention"):
        _BlockedRelPosAttention.apply(q, k.bfloat16(), v, *terms, None, "cpu")
    tables = [torch.randn(2 * h - 1, 8, requires_grad=True), torch.randn(2 * w - 1, 8, requires_grad=True)]
    inputs = [q, k.double().detach().requires_grad_(), v, *tables]  # mixed dtypes in
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = rel_pos_attention(*inputs, (h, w))
        assert out.dtype == torch.bfloat16 and out.grad_fn.name() == "_BlockedRelPosAttentionBackward"
        grads = torch.autograd.grad(out.float().square().sum(), inputs)
    reference = [t.detach().bfloat16().requires_grad_() for t in inputs[:3]] + \
        [t.detach().clone().requires_grad_() for t in tables]  # bf16 q, k, v; fp32 tables (cast inside)
    expected = torch.autograd.grad(rel_pos_attention(*reference, (h, w)).float().square().sum(), reference)
    for g, e, t in zip(grads, expected, inputs):
        assert g.dtype == t.dtype
        torch.testing.assert_close(g, e.to(t.dtype), rtol=0, atol=0)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


AMP_MODELS = {
    "windowed_rel_pos": dict(window_size=2, use_rel_pos=True),
    "global_rel_pos": dict(use_rel_pos=True),
    "padded_windows_rel_pos": dict(window_size=3, use_rel_pos=True),  # a 4x4 grid in 3x3 windows
    "token_merging": dict(token_merge_ratio=0.5),
    "hard_aggregation": dict(aggregation="hard", window_size=2, use_rel_pos=True),
    "soft_aggregation": dict(),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("options", AMP_MODELS.values(), ids=AMP_MODELS.keys())
def test_mixed_precision_agrees_with_fp32(options, dtype):
    """A training step under CPU autocast (how a GPU's fp16 / bf16 AMP runs here): the
    features agree with fp32's (cosine >= 0.999) and so does every parameter's gradient
    (>= 0.99), the recomputed attention included."""
    model = randomized(tiny(**options), seed=1).train()
    with torch.no_grad():  # small weights: a randomized model's features are not saturated
        for p in model.parameters():
            p.mul_(0.5)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))

    def step(autocast):
        model.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            features = model.forward_features(x)
        weights = torch.randn(features.shape, generator=torch.Generator().manual_seed(1))
        (features.float() * weights).sum().backward()
        return features.float().detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                            if p.grad is not None}  # the head has none

    features, grads = step(False)
    low_features, low_grads = step(True)
    assert low_grads.keys() == grads.keys() and len(grads) == len(list(model.parameters())) - 2
    assert _cosine(low_features, features) >= 0.999
    for name, grad in grads.items():
        if grad.abs().max() > 0:
            assert _cosine(low_grads[name], grad) >= 0.99, name


@pytest.mark.parametrize("grid,window", [((6, 7), 3), ((6, 6), 3), ((9, 9), 0)],
                         ids=["padded_windows", "windows", "global"])
@pytest.mark.parametrize("block_elements", [None, 200], ids=["default_blocks", "small_blocks"])
def test_the_gpu_choices_of_kernel_and_blocks_equal_the_cpu_ones(grid, window, block_elements):
    """Off the CPU, every block takes SDPA and the backward works in larger blocks
    (``blocks_take_sdpa``, ``default_block_elements``, chosen from the device type). Passing
    'cuda' runs those choices here: outputs and gradients equal the CPU choices' to 1e-5, for
    windows (padded to whole windows by ``window_qkv``) and the global grid."""
    from srvit_backbones.models.rel_pos import blocks_take_sdpa, default_block_elements

    size = (window, window) if window else grid
    keys = size[0] * size[1]
    assert blocks_take_sdpa("cuda", torch.float32, keys, 0.0) and not blocks_take_sdpa("cpu", torch.float32, keys, 0.0)
    assert default_block_elements("cuda", sdpa=False) > default_block_elements("cpu", sdpa=False)

    # the comparison make gpu-check runs
    from srvit_backbones.analysis.benchmark.devices import kernel_under_both_choices

    results = kernel_under_both_choices(grid, window, block_elements)
    for gpu, cpu in zip(results["cuda"], results["cpu"], strict=True):
        torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-5)


def test_relative_position_attention_keeps_no_query_by_key_tensor_for_backward():
    """Training memory: the recomputing backward saves tensors of the size of q, k, v and the
    per-axis terms only, in fp32 and under fp16 / bf16 autocast; autograd through the kernel (attention dropout) saves
    every block's (heads, queries, keys) bias, which is what the windowed detector used to peak on."""
    from srvit_backbones.models.rel_pos import rel_pos_attention

    torch.manual_seed(0)
    side, heads, C = 16, 2, 8
    N = side * side
    inputs = [torch.randn(1, heads, N, C, requires_grad=True) for _ in range(3)]
    inputs += [torch.randn(2 * side - 1, C, requires_grad=True) for _ in range(2)]

    def largest_saved(dropout_p, dtype=None):
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            rel_pos_attention(*inputs, (side, side), dropout_p)
        return max(sizes)

    for dtype in (None, torch.bfloat16, torch.float16):  # fp32, and fp16 / bf16 autocast
        assert largest_saved(0.0, dtype) <= heads * N * side  # the per-axis terms: (1, heads, side, side, side)
    assert largest_saved(0.1) >= heads * N * N


def test_a_new_depth_keeps_every_relative_position_table_in_use_or_is_refused():
    """``set_num_steps`` on a relative-position model: a depth at which a block would lose (or
    need) a windowed or global table is refused before anything changes, naming the block and
    the fix; an accepted depth trains with a gradient in every parameter (DDP's default
    ``find_unused_parameters=False`` needs that)."""
    bvit_like = dict(aggregation="last", step_transforms=False, use_rel_pos=True)
    model = tiny(window_size=2, **bvit_like)
    before = (model.num_steps, model.global_attn_indexes, list(model.units[1].window_sizes))
    with pytest.raises(ValueError, match=r"num_steps=1, block 0 of unit 1 would have global applications, but its "
                                         r"relative-position tables are for windowed and global applications.*"
                                         r"build the model with num_steps=1"):
        model.set_num_steps(1)
    assert (model.num_steps, model.global_attn_indexes, list(model.units[1].window_sizes)) == before

    for model, depth in ((tiny(window_size=2, **bvit_like), 5), (tiny(**bvit_like), 1), (tiny(**bvit_like), 6)):
        model = randomized(model)
        model.set_num_steps(depth)
        model(torch.randn(2, 3, 64, 64)).sum().backward()
        assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()] == []


COMPILED_MODELS = {
    "global": dict(),
    "padded_windows_rel_pos": dict(window_size=3, use_rel_pos=True),  # global applications too
    "token_merging": dict(token_merge_ratio=0.5),
}


@pytest.mark.parametrize("options", COMPILED_MODELS.values(), ids=COMPILED_MODELS.keys())
def test_the_backbones_compile_whole_and_match_eager(options):
    """``torch.compile(fullgraph=True)`` (a graph break is an error) of a training step's
    forward and backward, the recomputing attention's autograd.Function included, gives eager's
    features and gradients to 1e-5. AOT autograd's graphs run eagerly here (``aot_eager``):
    inductor's code generation takes minutes on this CPU (tools/benchmark.py --compile times it)."""
    import torch._dynamo

    model = randomized(tiny(layout=(1, 1), num_steps=2, **options), seed=1).train()  # small: tracing time
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))

    def step(forward):
        model.zero_grad()
        features = forward(x)
        (features * features.detach().cos()).sum().backward()
        return features.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    torch._dynamo.reset()
    compiled_features, compiled_grads = step(torch.compile(model.forward_features, backend="aot_eager",
                                                           fullgraph=True))
    features, grads = step(model.forward_features)
    torch.testing.assert_close(compiled_features, features, rtol=1e-5, atol=1e-5)
    assert compiled_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)


def test_the_windowed_detector_backbone_at_1024_compiles_whole_with_the_gpus_kernels(monkeypatch):
    """The backbone of mask_rcnn_srvit_s_t3_win.py (S-T3, 14x14 windows padded on the 64x64 grid,
    relative positions, 5 global applications of 32) in training at 1024, batch 1, with the
    attention kernels a CUDA device chooses (``device_type='cuda'``): what the backbones' compile
    switch compiles, with ``fullgraph=True`` (a graph break is an error), makes one graph of the
    whole forward. Traced only, on fake tensors (no arithmetic at 1024 on this CPU); the compiled
    runs that compute are compared with eager at small sizes (the DDP tests of each framework,
    test_the_backbones_compile_whole_and_match_eager)."""
    import torch._dynamo

    from srvit_backbones.models import attention, rel_pos
    from srvit_backbones.models.compiled import feature_maps

    monkeypatch.setattr(attention, "rel_pos_attention", partial(rel_pos.rel_pos_attention, device_type="cuda"))
    model = create_srvit("srvit_s_t3", img_size=1024, window_size=14, use_rel_pos=True, global_attn_indexes=None,
                         num_classes=0, global_pool="", drop_path_rate=0.1).train()
    model.prune_intermediate_layers([len(model.feature_points) - 1], prune_norm=True)  # as SRViTBackbone
    assert model.effective_depth == 32 and len(model.global_attn_indexes) == 5
    graphs = []

    def trace_only(graph, example_inputs):
        graphs.append(graph)
        outputs = next(node for node in graph.graph.nodes if node.op == "output").args[0]
        shapes = [(o.meta["example_value"].shape, o.meta["example_value"].dtype) for o in outputs]
        return lambda *args: [torch.empty(shape, dtype=dtype) for shape, dtype in shapes]

    torch._dynamo.reset()
    # the function the switch compiles, compiled here without the switch's cache of settings
    features = torch.compile(feature_maps, backend=trace_only, fullgraph=True)(model, torch.randn(1, 3, 1024, 1024), [])
    assert len(graphs) == 1 and features["last_feat"].shape == (1, 384, 64, 64)


@pytest.mark.parametrize("window", [0, 3], ids=["global", "windows"])
@pytest.mark.parametrize("options", [dict(), dict(qk_norm=True, scale_norm=True, norm_layer=nn.LayerNorm)],
                         ids=["plain", "norms"])
def test_grid_attention_is_timms_attention_with_its_optional_parts(options, window):
    """``grid_attention`` takes timm's ``Attention`` as it is, its optional parts included (q/k
    and output norms): over the whole grid it equals ``Attention.forward``,
    and in windows it equals ``Attention.forward`` on each window's tokens (padding aside)."""
    from timm.layers import Attention

    from srvit_backbones.models.attention import grid_attention

    torch.manual_seed(0)
    attn = Attention(32, num_heads=2, qkv_bias=True, **options).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 36, 32)
    if not window:
        torch.testing.assert_close(grid_attention(attn, x, (6, 6)), attn(x))
        return
    got = grid_attention(attn, x, (6, 6), window).view(2, 6, 6, 32)
    grid = x.view(2, 6, 6, 32)
    for r0, c0 in ((0, 0), (3, 3)):  # whole windows: tokens of one window only
        tokens = grid[:, r0:r0 + 3, c0:c0 + 3].reshape(2, 9, 32)
        torch.testing.assert_close(got[:, r0:r0 + 3, c0:c0 + 3].reshape(2, 9, 32), attn(tokens))
