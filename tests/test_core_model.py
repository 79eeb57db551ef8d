"""The core SR-ViT: SoftMoR semantics, variants, timm conventions, dense features."""
import copy

import pytest
import timm
import torch
import torch.nn as nn
from timm.models.vision_transformer import Block

import srvit_backbones  # noqa: F401
from helpers import unit_applications
from srvit_backbones import SoftMoRUnit, SRViT, create_srvit, make_layout
from srvit_backbones.models import VARIANTS
from srvit_backbones.models.softmor import apply_block


def tiny(**kw):
    args = dict(img_size=32, patch_size=16, embed_dim=32, num_heads=2, layout=(2, 1), num_steps=3,
                num_classes=5)
    args.update(kw)
    return SRViT(**args)


def blocks(k, dim=32):
    torch.manual_seed(0)
    return [Block(dim, 2, qkv_bias=True, norm_layer=nn.LayerNorm) for _ in range(k)]


def randomize(unit):
    """Non-zero router / step transforms so that the tests see them act."""
    with torch.no_grad():
        for p in unit.parameters():
            p.normal_(0, 0.2) if p.ndim > 1 else p.normal_(0, 0.1)
    return unit


# ----------------------------------------------------------------------------- unit semantics
def test_unit_t1_is_plain_block_stack_without_extra_parameters():
    bs = blocks(3)
    unit = SoftMoRUnit(copy.deepcopy(bs), unit_applications(len(bs), 1))
    assert unit.router is None and unit.step_transforms is None
    assert sum(p.numel() for p in unit.parameters()) == sum(p.numel() for b in bs for p in b.parameters())
    x = torch.randn(2, 7, 32)
    ref = x
    for b in bs:
        ref = b(ref)
    torch.testing.assert_close(unit(x), ref)


def test_last_without_step_transforms_is_blocks_applied_t_times():
    bs = blocks(2)
    unit = SoftMoRUnit(copy.deepcopy(bs), unit_applications(len(bs), 3), aggregation="last", step_transforms=False)
    assert unit.router is None
    x = torch.randn(2, 5, 32)
    ref = x
    for _ in range(3):
        for b in bs:
            ref = b(ref)
    torch.testing.assert_close(unit(x), ref)


def _step_outputs(unit, x):
    """Reference per-step outputs of Algorithm 1, written out independently."""
    outs, h = [], x
    for t in range(unit.num_steps):
        if t > 0 and unit.step_transforms is not None:
            h = h + unit.step_transforms[t - 1](h)
        for b in unit.blocks:
            h = b(h)
        outs.append(h)
    return torch.stack(outs, dim=-1)  # (B, N, D, T)


def test_zero_router_gives_mean_of_step_outputs():
    unit = SoftMoRUnit(blocks(2), unit_applications(2, 3))
    with torch.no_grad():  # keep the router at its zero init, make steps differ
        for st in unit.step_transforms:
            st.weight.normal_(0, 0.2)
    assert torch.count_nonzero(unit.router.weight) == 0
    x = torch.randn(2, 6, 32)
    torch.testing.assert_close(unit(x), _step_outputs(unit, x).mean(-1))


def test_soft_mixture_matches_algorithm_1():
    unit = randomize(SoftMoRUnit(blocks(2), unit_applications(2, 3)))
    x = torch.randn(2, 6, 32)
    alpha = torch.softmax(unit.router(x), dim=-1)  # (B, N, T)
    ref = (_step_outputs(unit, x) * alpha.unsqueeze(2)).sum(-1)
    y, weights = unit(x, return_weights=True)
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(weights, alpha)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 6))


def test_soft_mixture_gradients_match_algorithm_1():
    """The mixture is accumulated in place; its gradients must be those of the plain
    stack-and-sum formulation, for the input and every parameter."""
    unit = randomize(SoftMoRUnit(blocks(2), unit_applications(2, 3)))
    x = torch.randn(2, 6, 32, requires_grad=True)
    grad_out = torch.randn(2, 6, 32)
    ref = (_step_outputs(unit, x) * torch.softmax(unit.router(x), dim=-1).unsqueeze(2)).sum(-1)
    wrt = [x] + list(unit.parameters())
    expected = torch.autograd.grad(ref, wrt, grad_out)
    actual = torch.autograd.grad(unit(x), wrt, grad_out)
    for name, a, e in zip(["input"] + [n for n, _ in unit.named_parameters()], actual, expected):
        torch.testing.assert_close(a, e, msg=name)


def test_hard_picks_each_tokens_argmax_step():
    unit = randomize(SoftMoRUnit(blocks(1), unit_applications(1, 4), aggregation="hard"))
    x = torch.randn(3, 9, 32)
    steps = _step_outputs(unit, x)
    choice = unit.router(x).argmax(-1)  # (B, N)
    assert choice.unique().numel() > 1, "the test needs tokens that pick different steps"
    ref = torch.gather(steps, -1, choice[..., None, None].expand(-1, -1, 32, 1)).squeeze(-1)
    y, weights = unit(x, return_weights=True)
    torch.testing.assert_close(y, ref)
    assert torch.equal(weights.argmax(-1), choice) and torch.equal(weights.sum(-1), torch.ones(3, 9))


def _hard_reference_router_grad(unit, x, grad_out):
    """Straight-through gradient written out: the chosen weight alpha_c enters as
    alpha_c / stop_grad(alpha_c), so d loss / d logits = (g . h_c) * (one_hot_c - alpha)."""
    with torch.no_grad():
        steps = _step_outputs(unit, x)
        alpha = torch.softmax(unit.router(x), dim=-1)
        choice = alpha.argmax(-1)
        h_c = torch.gather(steps, -1, choice[..., None, None].expand(-1, -1, steps.shape[2], 1)).squeeze(-1)
        d_logits = (grad_out * h_c).sum(-1, keepdim=True) * (
            torch.nn.functional.one_hot(choice, unit.num_steps) - alpha)
    return d_logits.reshape(-1, unit.num_steps).T @ x.reshape(-1, x.shape[-1]), d_logits.sum((0, 1)), h_c


def test_hard_router_gradient_is_the_straight_through_estimate():
    unit = randomize(SoftMoRUnit(blocks(1), unit_applications(1, 3), aggregation="hard"))
    x, grad_out = torch.randn(2, 7, 32), torch.randn(2, 7, 32)
    weight_grad, bias_grad, h_c = _hard_reference_router_grad(unit, x, grad_out)
    y = unit(x)
    torch.testing.assert_close(y, h_c)
    y.backward(grad_out)
    torch.testing.assert_close(unit.router.weight.grad, weight_grad)
    torch.testing.assert_close(unit.router.bias.grad, bias_grad)


@pytest.mark.parametrize("bias,chosen", [((0.0, 200.0), 1), ((0.0, 0.0), 0)], ids=["saturated", "tie"])
def test_hard_is_finite_for_a_saturated_router_and_picks_the_first_of_ties(bias, chosen):
    """bias (0, 200): the other step's softmax weight underflows to exactly 0, which made the
    old estimator 0 * 0 / 0 = NaN. A tie (zero router) picks the first step, like argmax."""
    unit = randomize(SoftMoRUnit(blocks(1), unit_applications(1, 2), aggregation="hard"))
    with torch.no_grad():
        unit.router.weight.zero_()
        unit.router.bias.copy_(torch.tensor(bias))
    x = torch.randn(2, 5, 32, requires_grad=True)
    alpha = unit.router_weights(x)
    if chosen == 1:
        assert (alpha[..., 0] == 0).all(), "the test needs a weight that underflows to 0"
    y, weights = unit(x, return_weights=True)
    torch.testing.assert_close(y, _step_outputs(unit, x)[..., chosen])
    assert (weights.argmax(-1) == chosen).all()
    grad_out = torch.randn_like(y)
    y.backward(grad_out)
    grads = [x.grad] + [p.grad for p in unit.parameters()]
    assert all(torch.isfinite(g).all() for g in grads)
    weight_grad, bias_grad, _ = _hard_reference_router_grad(unit, x.detach(), grad_out)
    torch.testing.assert_close(unit.router.bias.grad, bias_grad)
    torch.testing.assert_close(unit.router.weight.grad, weight_grad)


def saved_activation_bytes(module, x):
    """Bytes of the distinct tensors autograd keeps for the backward pass of module(x),
    parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(kept.values())


def test_soft_mixture_keeps_no_per_step_copies():
    """Beyond what naive recursion keeps anyway, the soft mixture keeps only the last step's
    output and the (B, N, T) weights: no stack of the T outputs, no per-step products."""
    bs = blocks(2)
    soft = randomize(SoftMoRUnit(copy.deepcopy(bs), unit_applications(len(bs), 3)))
    last = SoftMoRUnit(copy.deepcopy(bs), unit_applications(len(bs), 3), aggregation="last")
    b, n, d, t = 2, 10, 32, 3
    x = torch.randn(b, n, d, requires_grad=True)
    extra = saved_activation_bytes(soft, x) - saved_activation_bytes(last, x)
    assert extra == 4 * (b * n * d + b * n * t)


@pytest.mark.parametrize("aggregation", ["soft", "hard"])
def test_gradients_reach_router_step_transforms_and_shared_blocks(aggregation):
    unit = randomize(SoftMoRUnit(blocks(2), unit_applications(2, 3), aggregation=aggregation))
    unit(torch.randn(2, 5, 32)).square().sum().backward()
    for name, p in unit.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_router_softmax_in_float32_under_autocast():
    """Under bf16 autocast the router's weights are float32 (the float32 softmax's), and the
    unit's output is the float32 one up to bf16 rounding: bf16 keeps 8 significant bits
    (relative rounding 2**-8), and each of the 3 steps adds bf16 attention and MLP branches
    to the residual stream, so the output may differ by about one rounding of its magnitude
    per step (3 * 2**-8 * max|y|; measured up to 1.25 * 2**-8 over 20 inputs, the same on the
    AVX-512 / AMX, AVX2 and SSE4.1 code paths)."""
    unit = randomize(SoftMoRUnit(blocks(1), unit_applications(1, 3)))
    x = torch.randn(1, 4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w = unit.router_weights(x)
        y = unit(x)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w, torch.softmax(unit.router(x), -1))
    reference = unit(x)
    assert not torch.equal(y.float(), reference)  # the blocks did run in bf16
    torch.testing.assert_close(y.float(), reference, rtol=0, atol=3 * 2 ** -8 * reference.abs().max().item())


def test_zero_init_is_configurable():
    unit = SoftMoRUnit(blocks(1), unit_applications(1, 2), zero_init=False)
    assert unit.router.weight.abs().sum() > 0 and unit.step_transforms[0].weight.abs().sum() > 0
    model = tiny()
    for unit in model.units[1:-1]:
        assert unit.router.weight.abs().sum() == 0 and unit.step_transforms[0].weight.abs().sum() == 0


def test_init_weights_without_arguments_keeps_the_built_settings():
    """Frameworks call ``init_weights()`` with no arguments (mmengine's BaseModule does):
    it must not reset ``zero_init_recursion=False`` or the init mode."""
    model = tiny(zero_init_recursion=False, weight_init="jax", num_classes=5)
    model.init_weights()
    for unit in model.units[1:-1]:
        assert unit.router.weight.abs().sum() > 0 and unit.step_transforms[0].weight.abs().sum() > 0
    assert model.head.weight.abs().sum() == 0  # jax mode: zero head
    model.init_weights(zero_init_recursion=True)
    assert all(u.router.weight.abs().sum() == 0 for u in model.units[1:-1])


def test_weight_init_modes_follow_timm():
    """'jax' is timm's JAX init (zero head, xavier-uniform linears, 1e-6 MLP biases), not the
    default truncated normal; an unknown mode names the choices."""
    torch.manual_seed(0)
    timm_model = tiny(weight_init="")
    jax = tiny(weight_init="jax")
    qkv_t, qkv_j = timm_model.units[0].blocks[0].attn.qkv.weight, jax.units[0].blocks[0].attn.qkv.weight
    bound = (6 / (qkv_j.shape[0] + qkv_j.shape[1])) ** 0.5
    assert qkv_j.abs().max() <= bound and qkv_j.std().item() > 0.5 * bound / 3 ** 0.5
    assert qkv_t.std().item() == pytest.approx(0.02, rel=0.15)
    assert jax.head.weight.abs().sum() == 0 and timm_model.head.weight.abs().sum() > 0
    fc1_bias = jax.units[0].blocks[0].mlp.fc1.bias
    assert 0 < fc1_bias.abs().max() < 1e-4
    assert (timm_model.units[0].blocks[0].mlp.fc1.bias == 0).all()
    nlhb = tiny(weight_init="jax_nlhb", num_classes=5)
    torch.testing.assert_close(nlhb.head.bias, torch.full((5,), -torch.log(torch.tensor(5.0)).item()))
    with pytest.raises(ValueError, match="weight_init must be one of.*'jax'"):
        tiny(weight_init="xavier")


# ----------------------------------------------------------------------------- model
@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_builds_and_runs(name):
    model = timm.create_model(name, num_classes=7, img_size=64)
    spec = VARIANTS[name]
    assert model.num_steps == spec["num_steps"] and model.layout == spec["layout"]
    ordinary = 2 if spec.get("ordinary_blocks", True) else 0
    assert model.effective_depth == ordinary + spec["num_steps"] * sum(spec["layout"])
    x = torch.randn(2, 3, 64, 48)
    assert model(x).shape == (2, 7)
    feats = model.forward_feature_maps(x)
    expected = {model.feature_name(i) for i in model.default_feature_indices} | {"last_feat"}
    assert set(feats) == expected
    for f in feats.values():
        assert f.shape == (2, spec["embed_dim"], 4, 3)


def test_effective_depths_match_paper():
    depths = {n: timm.create_model(n).effective_depth for n in
              ["srvit_t_t2", "srvit_t_t3", "srvit_s_t2", "srvit_s_t3", "srvit_s_t4", "srvit_b_t2", "srvit_b_t3",
               "srvit_deit_s"]}
    assert depths == {"srvit_t_t2": 14, "srvit_t_t3": 20, "srvit_s_t2": 22, "srvit_s_t3": 32,
                      "srvit_s_t4": 42, "srvit_b_t2": 22, "srvit_b_t3": 32, "srvit_deit_s": 12}


@pytest.mark.parametrize("org,expected", [("coarse_to_fine", (4, 3, 2, 1)), ("fine_to_coarse", (1, 2, 3, 4)),
                                          ("coarse_grained", (10,)), ("fine_grained", (1,) * 10)])
def test_unit_organisations(org, expected):
    assert make_layout(org, 10) == expected
    model = create_srvit("srvit_s_t2", layout=org, img_size=32, num_classes=0)
    assert model.layout == expected
    assert [len(u.blocks) for u in model.units] == [1, *expected, 1]
    assert sum(len(u.blocks) for u in model.units) == 12


def test_any_t_and_unique_parameters_do_not_grow_with_t():
    counts = [sum(p.numel() for n, p in tiny(num_steps=t).named_parameters() if ".blocks." in n) for t in (1, 2, 5)]
    assert counts[0] == counts[1] == counts[2]
    assert tiny(num_steps=5).effective_depth == 2 + 5 * 3


def test_drop_path_is_scheduled_over_effective_depth():
    model = tiny(drop_path_rate=0.3)  # D_eff = 2 + 3 * 3 = 11
    rates = [r for u in model.units for r in u.drop_path_rates]
    torch.testing.assert_close(torch.tensor(rates), torch.linspace(0, 0.3, 11))
    # a shared block gets a larger rate at each later application
    unit = model.units[1]
    assert unit.drop_path_rates[0] < unit.drop_path_rates[2] < unit.drop_path_rates[4]
    model.train()
    torch.manual_seed(0)
    a = model(torch.randn(4, 3, 32, 32))
    assert torch.isfinite(a).all()


def test_each_block_application_drops_with_its_own_rate():
    """A shared block's applications have their own rates: with rates (0, 1, 1, 0) over
    (step 0: b0, b1; step 1: b0, b1) only b0 then b1 run; with (1, 0, 0, 1) only b1 then b0."""
    bs = blocks(2)
    x = torch.randn(3, 5, 32)
    for rates, order in [((0.0, 1.0, 1.0, 0.0), (0, 1)), ((1.0, 0.0, 0.0, 1.0), (1, 0))]:
        unit = SoftMoRUnit(copy.deepcopy(bs), unit_applications(len(bs), 2, rates), aggregation="last",
                           step_transforms=False).train()
        torch.testing.assert_close(unit(x), bs[order[1]](bs[order[0]](x)))
    # an intermediate rate r drops each of the application's two residual branches per sample
    # with probability r: both are dropped, leaving the input unchanged, for r^2 of 4000 samples
    torch.manual_seed(0)
    x = torch.randn(4000, 2, 32)
    with torch.no_grad():
        h = bs[1](bs[0](x))
        for rate in (0.3, 0.6):
            unit = SoftMoRUnit(copy.deepcopy(bs), unit_applications(len(bs), 2, (0.0, 0.0, rate, 0.0)),
                               aggregation="last", step_transforms=False).train()
            skipped = torch.isclose(unit(x), bs[1](h), atol=1e-5).flatten(1).all(1)
            assert abs(skipped.float().mean().item() - rate ** 2) < 0.025, rate


def test_checkpointed_and_plain_forward_backward_agree():
    torch.manual_seed(0)
    model = tiny()
    for unit in model.units:
        randomize_recursion(unit)
    ref_model = copy.deepcopy(model)
    model.set_grad_checkpointing(True)
    assert all(u.grad_checkpointing for u in model.units)
    x = torch.randn(2, 3, 32, 32)
    out, ref = model(x), ref_model(x)
    torch.testing.assert_close(out, ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


def randomize_recursion(unit):
    with torch.no_grad():
        if unit.router is not None:
            unit.router.weight.normal_(0, 0.3)
        for st in unit.step_transforms or []:
            st.weight.normal_(0, 0.1)


def test_distillation_token_and_heads():
    model = tiny(distilled=True)
    assert model.num_prefix_tokens == 2 and model.pos_embed.shape[1] == 4 + 2
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    y = model(x)
    feats = model.forward_features(x)
    torch.testing.assert_close(y, (model.head(feats[:, 0]) + model.head_dist(feats[:, 1])) / 2)
    model.train()
    model.set_distilled_training(True)
    cls_logits, dist_logits = model(x)
    assert cls_logits.shape == dist_logits.shape == (2, 5)
    assert model.forward_feature_maps(x)["last_feat"].shape == (2, 32, 2, 2)


@pytest.mark.parametrize("size", [(1024, 1024), (512, 1024)])
def test_position_embedding_interpolated_for_dense_inputs(size):
    model = tiny(img_size=224)
    x = torch.randn(1, 3, *size)
    feats = model.forward_feature_maps(x, return_mixture=True)
    h, w = size[0] // 16, size[1] // 16
    assert feats["last_feat"].shape == (1, 32, h, w)
    assert feats["mixture1"].shape == (1, 3, h, w)
    torch.testing.assert_close(feats["mixture1"].sum(1), torch.ones(1, h, w))
    # the interpolated table is timm's bicubic resample of the 14x14 one
    tokens, grid = model.embed(x)
    ref = timm.layers.resample_abs_pos_embed(model.pos_embed, [h, w], [14, 14], num_prefix_tokens=1,
                                             interpolation="bicubic", antialias=False)
    patches = model.patch_embed(x)
    torch.testing.assert_close(tokens, torch.cat([model.cls_token, patches], 1) + ref)


def test_non_multiple_of_patch_size_is_a_clear_error():
    with pytest.raises(ValueError, match="not a multiple of the patch size 16.*pad"):
        tiny()(torch.randn(1, 3, 40, 32))


def test_state_dict_round_trip():
    a, b = tiny(), tiny()
    for unit in a.units:
        randomize_recursion(unit)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 32, 32)
    a.eval(), b.eval()
    torch.testing.assert_close(a(x), b(x))
    assert not any(k.startswith("blocks.") for k in a.state_dict())


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_steps=0), "num_steps"),
    (dict(layout=()), "layout"),
    (dict(embed_dim=30, num_heads=4), "embed_dim"),
    (dict(aggregation="max"), "aggregation"),
    (dict(layout="spiral"), "layout"),
    (dict(layout="coarse_to_fine", num_middle_blocks=5), "triangular"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kwargs)


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown SR-ViT variant 'srvit_s_t9'.*srvit_s_t3"):
        create_srvit("srvit_s_t9")


def test_bad_feature_index_is_a_clear_error():
    with pytest.raises(ValueError, match="feature index 9 does not exist.*recursive units"):
        tiny().forward_feature_maps(torch.randn(1, 3, 32, 32), indices=[1, 9])


# ----------------------------------------------------------------------------- timm conventions
def test_timm_create_model_conventions():
    model = timm.create_model("srvit_s_t3", num_classes=10, drop_path_rate=0.1, img_size=64)
    assert isinstance(model, SRViT) and model.num_classes == 10
    assert model.units[-1].drop_path_rates[-1] == pytest.approx(0.1)
    assert model.pretrained_cfg["input_size"] == (3, 224, 224) and model.pretrained_cfg["crop_pct"] == 0.875
    assert {"pos_embed", "cls_token"} <= model.no_weight_decay()
    x = torch.randn(1, 3, 64, 64)
    feats = model.forward_features(x)
    assert feats.shape == (1, 1 + 16, 384)
    assert model.forward_head(feats, pre_logits=True).shape == (1, 384)
    model.reset_classifier(3)
    assert model(x).shape == (1, 3) and model.get_classifier().out_features == 3
    model.set_grad_checkpointing()
    assert model(x).shape == (1, 3)


def test_timm_forward_intermediates_and_features_only():
    model = timm.create_model("srvit_s_t2", img_size=64, num_classes=0)
    x = torch.randn(2, 3, 64, 32)
    final, inter = model.forward_intermediates(x, indices=[1, 2, 3, 4])
    assert final.shape == (2, 1 + 8, 384) and [f.shape for f in inter] == [(2, 384, 4, 2)] * 4
    maps = model.forward_feature_maps(x)
    for i, f in zip([1, 2, 3, 4], inter):
        torch.testing.assert_close(f, maps[f"unit{i}"])

    backbone = timm.create_model("srvit_s_t2", img_size=64, features_only=True)
    assert backbone.feature_info.channels() == [384] * 4 and backbone.feature_info.reduction() == [16] * 4
    result = backbone.model.load_state_dict(model.state_dict(), strict=False)
    assert not result.missing_keys and set(result.unexpected_keys) == {  # the pruned last block, the norm
        k for k in model.state_dict() if k.startswith(("units.5.", "norm."))}
    outs = backbone(x)
    for out, ref in zip(outs, inter):
        torch.testing.assert_close(out, ref)
    deit = timm.create_model("srvit_deit_s", img_size=64, features_only=True)
    assert deit.feature_info.module_name() == ["units.2", "units.5", "units.8", "units.11"]


def test_timm_deit_weights_give_identical_logits(tmp_path):
    deit = timm.create_model("deit_small_patch16_224", pretrained=False).eval()
    path = tmp_path / "deit_s.pth"
    torch.save(deit.state_dict(), path)
    ours = timm.create_model("srvit_deit_s", pretrained=True,
                             pretrained_cfg_overlay=dict(file=str(path))).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), deit(x))
    # the same DeiT weights in the SR-ViT-S layout at T=1 (S-R4-R3-R2-R1-S): same function
    s_t1 = create_srvit("srvit_s_t2", num_steps=1).eval()
    report = srvit_backbones.load_pretrained(s_t1, str(path))
    assert report.complete
    with torch.no_grad():
        torch.testing.assert_close(s_t1(x), deit(x))


def test_timm_checkpoint_filter_resizes_pos_embed(tmp_path):
    src = timm.create_model("srvit_s_t2", num_classes=0).eval()  # 14x14 grid
    path = tmp_path / "s224.pth"
    torch.save({"model": src.state_dict()}, path)
    big = timm.create_model("srvit_s_t2", num_classes=0, img_size=384, pretrained=True,
                            pretrained_cfg_overlay=dict(file=str(path)))
    assert big.pos_embed.shape == (1, 1 + 24 * 24, 384)
    ref = timm.layers.resample_abs_pos_embed(src.pos_embed, [24, 24], [14, 14], num_prefix_tokens=1,
                                             interpolation="bicubic", antialias=False)
    torch.testing.assert_close(big.pos_embed.data, ref)


def test_attention_is_fused_sdpa():
    model = tiny()
    assert all(b.attn.fused_attn for u in model.units for b in u.blocks)  # F.scaled_dot_product_attention


def test_block_application_with_zero_drop_path_equals_block():
    b = blocks(1)[0]
    x = torch.randn(2, 3, 32)
    torch.testing.assert_close(apply_block(b, x, 0.0, True), b(x))


def test_prune_intermediate_layers_keeps_the_model_consistent():
    model = create_srvit("srvit_s_t2", img_size=32, embed_dim=32, num_heads=2, num_classes=0)
    assert model.prune_intermediate_layers([1, 3], prune_norm=True) == [1, 3]
    assert len(model.units) == 4 and model.unit_sizes == [1, 4, 3, 2]
    assert [f["module"] for f in model.feature_info] == ["units.0", "units.1", "units.2", "units.3"]
    assert model.recursive_unit_indices == (1, 2, 3)
    assert model.effective_depth == 1 + 2 * (4 + 3 + 2)
    x = torch.randn(2, 3, 32, 32)
    feats = model.forward_feature_maps(x)  # the remaining recursive units, no KeyError
    assert set(feats) == {"unit1", "unit2", "unit3", "last_feat"}
    torch.testing.assert_close(feats["last_feat"], feats["unit3"])
    sum(f.sum() for f in feats.values()).backward()
    assert all(p.grad is not None for p in model.parameters())  # nothing held without a gradient
    with pytest.raises(ValueError, match="feature index 4 does not exist"):
        model.forward_feature_maps(x, indices=[4])


def test_timm_layer_decay_uses_the_one_rule():
    """timm's create_optimizer_v2(layer_decay=...) groups by group_matcher: every parameter
    must get the factor of srvit_backbones.layer_decay."""
    from timm.optim import create_optimizer_v2

    from srvit_backbones.layer_decay import lr_decay_factor

    model = create_srvit("srvit_s_t3", img_size=32, embed_dim=32, num_heads=2, num_classes=4, distilled=True)
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.7)
    scale = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    named = list(model.named_parameters())
    assert len(scale) == len(named)
    for name, p in named:
        assert scale[id(p)] == pytest.approx(lr_decay_factor(name, 0.7, model.unit_sizes)), name
    assert len({round(v, 12) for v in scale.values()}) == sum(model.unit_sizes) + 2  # embeddings .. head


def test_features_only_pretrained_loading_is_strict(tmp_path):
    full = timm.create_model("srvit_s_t2", img_size=32, embed_dim=32, num_heads=2, num_classes=0)
    sd = full.state_dict()
    torch.save(sd, tmp_path / "full.pth")
    backbone = timm.create_model("srvit_s_t2", img_size=32, embed_dim=32, num_heads=2, features_only=True,
                                 pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "full.pth")))
    for name, value in backbone.model.state_dict().items():
        assert torch.equal(value, sd[name]), name
    assert len(backbone.model.units) == 5  # pruned after the last recursive unit
    del sd["units.2.blocks.1.attn.qkv.weight"]
    torch.save(sd, tmp_path / "partial.pth")
    with pytest.raises(srvit_backbones.CheckpointError, match=r"does not hold 1 of.*\n  units\.2\.blocks\.\*"):
        timm.create_model("srvit_s_t2", img_size=32, embed_dim=32, num_heads=2, features_only=True,
                          pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "partial.pth")))
    partial = timm.create_model("srvit_s_t2", img_size=32, embed_dim=32, num_heads=2, features_only=True,
                                pretrained=True, pretrained_strict=False,
                                pretrained_cfg_overlay=dict(file=str(tmp_path / "partial.pth")))
    assert torch.equal(partial.model.units[2].blocks[1].attn.proj.weight, sd["units.2.blocks.1.attn.proj.weight"])
