"""bViT (one shared block applied T times) and MergeOver-style token merging inside recursive
units: both are arguments of the one core model."""
import pytest
import timm
import torch
import torch.nn.functional as F
from timm.optim import create_optimizer_v2

import srvit_backbones  # noqa: F401  (registers the variants)
from helpers import load_tool
from srvit_backbones import load_pretrained
from srvit_backbones.checkpoint import CheckpointError
from srvit_backbones.layer_decay import layer_id, lr_decay_factor
from srvit_backbones.models.merge import BipartiteMerge


def tiny_bvit(**kw):
    kw = dict(dict(img_size=64, embed_dim=64, num_heads=2, num_classes=0), **kw)
    return timm.create_model("bvit_s", **kw).eval()


def by_hand(model, x, steps):
    """bViT computed from its definition: embed, then the one block applied ``steps`` times."""
    tokens, _ = model.embed(x)
    block = model.units[0].blocks[0]
    outputs = []
    for _ in range(steps):
        tokens = block(tokens)
        outputs.append(tokens)
    return outputs


# ----------------------------------------------------------------------------- bViT
def test_bvit_parameter_counts():
    """bViT-B: one ViT-B block (7.09M) + embeddings + head = 8.6M (the source's figure)."""
    model = timm.create_model("bvit_b")
    block = model.units[0].blocks[0]
    assert len(model.units) == 1 and model.unit_sizes == [1] and model.effective_depth == 12
    assert model.units[0].router is None and model.units[0].step_transforms is None
    assert sum(p.numel() for p in block.parameters()) == 7_087_872
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 8.6
    small = timm.create_model("bvit_s")
    assert small.embed_dim == 384 and small.units[0].blocks[0].attn.num_heads == 6
    assert round(sum(p.numel() for p in small.parameters()) / 1e6, 2) == 2.53  # 1.77M block, 0.77M embeddings + head


def test_bvit_is_one_block_applied_t_times_at_any_depth():
    """The same weights run at 12, 6 and 24 steps, in place (``set_num_steps``) or built at
    that depth with the 12-step state dict (no key or shape depends on T)."""
    torch.manual_seed(0)
    model = tiny_bvit()
    state = model.state_dict()
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        reference = by_hand(model, x, 24)
        torch.testing.assert_close(model.forward_features(x), model.norm(reference[11]))
        for depth in (6, 24):
            built = tiny_bvit(num_steps=depth)
            assert set(built.state_dict()) == set(state)
            built.load_state_dict(state)
            torch.testing.assert_close(built.forward_features(x), model.norm(reference[depth - 1]))
        model.set_num_steps(24)
        assert model.effective_depth == 24 and model.state_dict().keys() == state.keys()
        torch.testing.assert_close(model.forward_features(x), model.norm(reference[23]))
        assert not torch.allclose(reference[23], reference[11])


def test_a_soft_model_explains_why_its_depth_is_fixed():
    with pytest.raises(ValueError, match="router was trained to mix exactly T=3 steps"):
        timm.create_model("srvit_t_t3", embed_dim=64, num_heads=2).set_num_steps(4)
    with pytest.raises(ValueError, match="one trained step transform per step"):
        timm.create_model("srvit_t_t3", embed_dim=64, num_heads=2, aggregation="last").set_num_steps(4)
    with pytest.raises(ValueError, match="step_features=True .* aggregation='soft' mixes its steps"):
        timm.create_model("srvit_t_t3", step_features=True)


@pytest.mark.parametrize("depth, expected", [(12, (2, 5, 8, 11)), (24, (5, 11, 17, 23)), (4, (0, 1, 2, 3)),
                                             (6, (1, 2, 4, 5))])
def test_bvit_features_are_the_quarter_steps(depth, expected):
    """Steps T/4, T/2, 3T/4 and T, the way DeiT exposes layers 3/6/9/12, through
    ``forward_feature_maps``, ``forward_intermediates`` and timm's ``features_only``."""
    torch.manual_seed(0)
    model = tiny_bvit(num_steps=depth)
    assert model.default_feature_indices == expected
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        steps = by_hand(model, x, depth)
        feats = model.forward_feature_maps(x)
        assert set(feats) == {f"step{i}" for i in expected} | {"last_feat"}
        for i in expected:
            torch.testing.assert_close(feats[f"step{i}"], model.tokens_to_map(steps[i], (3, 4)))
        inter = model.forward_intermediates(x, indices=list(expected), intermediates_only=True)
        for i, m in zip(expected, inter):
            torch.testing.assert_close(m, feats[f"step{i}"])
    backbone = timm.create_model("bvit_s", img_size=64, embed_dim=64, num_heads=2, num_steps=depth,
                                 features_only=True).eval()
    backbone.model.load_state_dict(model.state_dict(), strict=False)
    assert backbone.feature_info.out_indices == expected
    assert backbone.model.units[0].num_steps == depth  # the last feature is the last step: nothing pruned
    with torch.no_grad():
        for i, m in zip(expected, backbone(x)):
            torch.testing.assert_close(m, feats[f"step{i}"])


def test_pruning_to_an_earlier_step_runs_only_the_steps_needed():
    torch.manual_seed(0)
    model = tiny_bvit()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        full = model.forward_feature_maps(x, indices=[2, 5])
    model.prune_intermediate_layers([2, 5])
    assert model.units[0].num_steps == 6 and model.effective_depth == 6 and len(model.feature_info) == 6
    with torch.no_grad():
        pruned = model.forward_feature_maps(x, indices=[2, 5])
    for key in ("step2", "step5"):
        torch.testing.assert_close(pruned[key], full[key])
    torch.testing.assert_close(pruned["last_feat"], full["step5"])
    with pytest.raises(ValueError, match="6 recursion steps as features"):
        model.forward_feature_maps(x, indices=[8])


def test_bvit_layer_decay_rule():
    """Embeddings at id 0 (decay**2), the one shared block at id 1 (decay), the rest at 2;
    timm's optimizer factory gives the same factors through ``group_matcher``."""
    model = timm.create_model("bvit_s", num_classes=10, embed_dim=64, num_heads=2)
    sizes = model.unit_sizes
    assert sizes == [1]
    ids = {n: layer_id(n, sizes) for n, _ in model.named_parameters()}
    assert {ids[n] for n in ids if n.startswith(("pos_embed", "cls_token", "patch_embed"))} == {0}
    assert {ids[n] for n in ids if n.startswith("units.0.blocks.0.")} == {1}
    assert {ids[n] for n in ids if n.startswith(("norm.", "head."))} == {2}
    assert lr_decay_factor("pos_embed", 0.5, sizes) == 0.25
    assert lr_decay_factor("units.0.blocks.0.mlp.fc1.weight", 0.5, sizes) == 0.5
    assert lr_decay_factor("head.weight", 0.5, sizes) == 1.0
    optimizer = create_optimizer_v2(model, "adamw", lr=1e-3, layer_decay=0.5)
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            assert group["lr_scale"] == pytest.approx(lr_decay_factor(names[id(p)], 0.5, sizes))


def test_a_vit_checkpoint_seeds_the_shared_block():
    """By default the middle block of a 12-block ViT (block 6) seeds bViT's block; any block
    can be chosen; the other blocks are reported as dropped; a wrong choice is a clear error."""
    vit = timm.create_model("vit_small_patch16_224", num_classes=10)
    model = timm.create_model("bvit_s", num_classes=10)
    report = load_pretrained(model, vit.state_dict())
    block = model.units[0].blocks[0]
    assert torch.equal(block.attn.qkv.weight, vit.blocks[6].attn.qkv.weight)
    assert torch.equal(block.mlp.fc2.bias, vit.blocks[6].mlp.fc2.bias)
    assert torch.equal(model.pos_embed, vit.pos_embed) and torch.equal(model.head.weight, vit.head.weight)
    assert any("blocks.6 -> units.0.blocks.0" in n for n in report.notes)
    assert len(report.dropped) == 11 * len([k for k in vit.state_dict() if k.startswith("blocks.0.")])
    load_pretrained(model, vit.state_dict(), vit_blocks=[3])
    assert torch.equal(model.units[0].blocks[0].attn.proj.weight, vit.blocks[3].attn.proj.weight)
    with pytest.raises(CheckpointError, match="the checkpoint has blocks 0..11 and the model 1 unique blocks"):
        load_pretrained(model, vit.state_dict(), vit_blocks=[12])


# ----------------------------------------------------------------------------- token merging
def test_merge_then_unmerge_keeps_every_token_that_was_not_merged():
    """Orthogonal tokens (nothing similar): the r merged A tokens and their partners take the
    pair's mean, every other token and the prefix token come back bit for bit."""
    torch.manual_seed(0)
    n, dim = 33, 64  # one prefix token and 32 patches
    x = torch.linalg.qr(torch.randn(dim, dim))[0][:n].unsqueeze(0).repeat(2, 1, 1)
    x[1] = x[1, torch.randperm(n)]
    merge = BipartiteMerge(x, ratio=0.25, num_prefix_tokens=1)
    assert merge.r == 8 and merge.merge(x).shape == (2, n - 8, dim)
    assert merge.size.sum(dim=1).flatten().tolist() == [n, n]
    restored = merge.unmerge(merge.merge(x))
    for b in range(2):
        a_index = 1 + 2 * merge.merged_a[b]
        b_index = 2 + 2 * merge.partner_b[b]
        touched = set(a_index.tolist()) | set(b_index.tolist())
        untouched = [i for i in range(n) if i not in touched]
        assert 0 in untouched
        torch.testing.assert_close(restored[b, untouched], x[b, untouched], rtol=0, atol=0)
        for i, j in zip(a_index.tolist(), b_index.tolist()):
            partners = (b_index == j).nonzero().flatten()
            group = x[b, [j] + a_index[partners].tolist()].mean(0)
            torch.testing.assert_close(restored[b, i], group)
    zero = BipartiteMerge(x, ratio=0.0, num_prefix_tokens=1)
    torch.testing.assert_close(zero.unmerge(zero.merge(x)), x, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"token_merge_ratio must be in \[0, 0.5\]"):
        BipartiteMerge(x, ratio=0.6)


def test_merging_duplicates_with_proportional_attention_is_exact():
    """Tokens that come in identical pairs (A_i == B_i): ratio 0.5 merges every pair, and with
    proportional attention (log size added to the logits) the unit's output, unmerged, equals
    the unmerged computation. Without the size bias it would not."""
    torch.manual_seed(0)
    model = timm.create_model("srvit_t_t3", img_size=64, embed_dim=64, num_heads=2, num_classes=0,
                              zero_init_recursion=False).eval()
    unit = model.units[1]
    patches = torch.randn(2, 8, 64).repeat_interleave(2, dim=1)  # 16 patches in identical pairs
    x = torch.cat([torch.randn(2, 1, 64), patches], dim=1)
    with torch.no_grad():
        expected, weights = unit(x, return_weights=True, grid=(4, 4))
        unit.set_token_merge_ratio(0.5)
        merged, merged_weights = unit(x, return_weights=True, grid=(4, 4))
        torch.testing.assert_close(merged, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(merged_weights, weights, rtol=1e-5, atol=1e-6)
        merge = BipartiteMerge(unit.blocks[0].norm1(x), 0.5, 1)
        assert merge.r == 8 and (merge.size[:, 1:] == 2).all()
        without_size = merge.unmerge(unit._recur(merge.merge(x), None, None, [])[0])
        assert not torch.allclose(without_size, expected, atol=1e-3)


def test_token_merging_keeps_shapes_and_is_exact_at_zero():
    torch.manual_seed(0)
    model = timm.create_model("srvit_t_t3", img_size=64, embed_dim=64, num_heads=2, num_classes=0,
                              zero_init_recursion=False).eval()
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        reference = model.forward_feature_maps(x, return_mixture=True)
        model.set_token_merge_ratio(0.5)
        merged = model.forward_feature_maps(x, return_mixture=True)
        assert {k: v.shape for k, v in merged.items()} == {k: v.shape for k, v in reference.items()}
        assert not torch.allclose(merged["unit1"], reference["unit1"])
        torch.testing.assert_close(merged["mixture1"].sum(1), torch.ones(2, 4, 3))
        model.set_token_merge_ratio(0.0)
        again = model.forward_feature_maps(x, return_mixture=True)
    for key in reference:
        assert torch.equal(again[key], reference[key])
    built = timm.create_model("srvit_t_t3", img_size=64, embed_dim=64, num_heads=2, num_classes=0,
                              zero_init_recursion=False, token_merge_ratio=0.25).eval()
    assert [built.units[u].token_merge_ratio for u in range(len(built.units))] == [0, 0.25, 0.25, 0.25, 0]
    built.load_state_dict(model.state_dict())
    built.set_grad_checkpointing()
    built.train()
    built.forward_features(x).sum().backward()  # trains through the merge too
    assert all(p.grad is not None for p in built.parameters())


def tokens_seen_by_blocks(model):
    """Hooks recording, for every block application, (unit, tokens its attention's qkv
    projection takes, dtype of the projection's output); returns the list they fill and their
    handles."""
    seen, handles = [], []
    for u, unit in enumerate(model.units):
        for block in unit.blocks:
            handles.append(block.attn.qkv.register_forward_hook(
                lambda m, args, out, u=u: seen.append((u, args[0].shape[1], out.dtype))))
    return seen, handles


def test_token_merging_works_in_bvit_step_features():
    """Every one of the 12 applications runs on the merged tokens (the class token and 16 - 8
    patches), and each step feature is that step's output unmerged to the full grid: the
    merge, then the block with proportional attention (log size as its attention mask) step
    after step, by hand; a merged patch takes its partner's value, so a map holds 8 distinct
    vectors."""
    torch.manual_seed(0)
    model = tiny_bvit(token_merge_ratio=0.5)
    x = torch.randn(1, 3, 64, 64)
    seen, handles = tokens_seen_by_blocks(model)
    with torch.no_grad():
        feats = model.forward_feature_maps(x)
    for h in handles:
        h.remove()
    assert [tokens for _, tokens, _ in seen] == [1 + 16 - 8] * 12
    assert all(f.shape == (1, 64, 4, 4) for f in feats.values())
    block = model.units[0].blocks[0]
    with torch.no_grad():
        tokens, _ = model.embed(x)
        merge = BipartiteMerge(block.norm1(tokens), 0.5, num_prefix_tokens=1)
        h, steps = merge.merge(tokens), []
        for _ in range(12):
            h = block(h, attn_mask=merge.attention_bias(h.dtype))
            steps.append(merge.unmerge(h))
    assert set(feats) == {"step2", "step5", "step8", "step11", "last_feat"}
    for i in (2, 5, 8, 11):
        torch.testing.assert_close(feats[f"step{i}"], model.tokens_to_map(steps[i], (4, 4)))
        assert feats[f"step{i}"].flatten(2).unique(dim=-1).shape[-1] == 8


@pytest.mark.parametrize("kwargs, match", [
    (dict(window_size=2, use_rel_pos=True), "token merging needs global attention"),
    (dict(use_rel_pos=True), "token merging needs global attention"),
    (dict(num_steps=1), "inside recursive units .T > 1. and this model has none"),
    (dict(), r"token_merge_ratio must be in \[0, 0.5\]"),
])
def test_token_merging_bad_settings_are_explained(kwargs, match):
    ratio = 0.7 if not kwargs else 0.25
    with pytest.raises(ValueError, match=match):
        timm.create_model("srvit_t_t2", img_size=64, embed_dim=64, num_heads=2, token_merge_ratio=ratio, **kwargs)


def test_torchscript_refuses_token_merging():
    model = timm.create_model("srvit_t_t2", img_size=64, embed_dim=64, num_heads=2, token_merge_ratio=0.25)
    with pytest.raises(RuntimeError, match="TorchScript does not support token merging"):
        torch.jit.script(model)


def test_token_merging_under_bf16_autocast():
    """Under bf16 autocast the recursive units run merged (the class token and 16 - 8 patches;
    the ordinary first and last blocks all 17 tokens) with bf16 projections, close to fp32."""
    model = timm.create_model("srvit_t_t2", img_size=64, embed_dim=64, num_heads=2, num_classes=0,
                              token_merge_ratio=0.5).eval()
    x = torch.randn(1, 3, 64, 64)
    seen, handles = tokens_seen_by_blocks(model)
    with torch.no_grad():
        fp32 = model.forward_features(x)
        del seen[:]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model.forward_features(x)
    for h in handles:
        h.remove()
    recursive = set(model.recursive_unit_indices)
    assert recursive == {1, 2, 3} and {u for u, _, _ in seen} == {0, 1, 2, 3, 4}
    assert [tokens for u, tokens, _ in seen] == [1 + 16 - 8 if u in recursive else 17 for u, _, _ in seen]
    assert {dtype for _, _, dtype in seen} == {torch.bfloat16}
    assert F.cosine_similarity(fp32.flatten(), bf16.float().flatten(), dim=0) > 0.99


# ----------------------------------------------------------------------------- adapters
def test_detectron2_backbone_takes_bvit_steps_and_token_merging():
    from srvit_backbones.detectron2 import SRViTBackbone

    backbone = SRViTBackbone("bvit_s", img_size=64, embed_dim=64, num_heads=2, out_features=["step2", "step5"],
                             token_merge_ratio=0.5)
    assert backbone.srvit.units[0].num_steps == 6  # holds and runs only the steps it returns
    assert backbone.srvit.units[0].token_merge_ratio == 0.5
    out = backbone(torch.randn(2, 3, 64, 48))
    assert {k: tuple(v.shape) for k, v in out.items()} == {"step2": (2, 64, 4, 3), "step5": (2, 64, 4, 3)}
    sum(v.sum() for v in out.values()).backward()
    assert [n for n, p in backbone.named_parameters() if p.grad is None] == []
    with pytest.raises(ValueError, match=r"unknown \['unit1'\].*'step11'.*default: \['step2', 'step5', 'step8'"):
        SRViTBackbone("bvit_s", img_size=64, embed_dim=64, num_heads=2, out_features=["unit1"])


def test_mmseg_backbone_takes_bvit_steps_and_token_merging():
    from mmseg.registry import MODELS

    import srvit_backbones.mmseg  # noqa: F401  (registers SRViT)

    backbone = MODELS.build(dict(type="SRViT", variant="bvit_s", img_size=64, embed_dim=64, num_heads=2,
                                 token_merge_ratio=0.25, _scope_="mmseg"))
    assert backbone.out_indices == [2, 5, 8, 11]
    x = torch.randn(1, 3, 64, 64)
    outs = backbone(x)
    assert [tuple(o.shape) for o in outs] == [(1, 64, 4, 4)] * 4
    backbone.srvit.set_token_merge_ratio(0.0)
    backbone.eval()  # no drop-path
    with torch.no_grad():
        steps = by_hand(backbone.srvit, x, 12)
        for i, o in zip([2, 5, 8, 11], backbone(x)):
            torch.testing.assert_close(o, backbone.srvit.tokens_to_map(steps[i], (4, 4)))


def test_merge_fidelity_tool_on_a_framework_checkpoint(tmp_path, capsys):
    """tools/merge_fidelity.py finds the backbone in a detectron2-style checkpoint and reports
    1.0 at ratio 0 and lower similarity as more tokens merge."""
    from PIL import Image

    torch.manual_seed(0)
    core = timm.create_model("srvit_t_t2", img_size=64, embed_dim=64, num_heads=2, num_classes=0,
                             zero_init_recursion=False)
    state = {f"backbone.net.srvit.{k}": v for k, v in core.state_dict().items() if not k.startswith("norm.")}
    torch.save({"model": state, "iteration": 9}, tmp_path / "model_final.pth")
    rng = torch.Generator().manual_seed(0)
    for i in range(2):  # smooth images with structure, so that similar neighbours exist
        low = torch.rand(3, 4, 4, generator=rng)
        image = F.interpolate(low[None], size=(64, 64), mode="bilinear", align_corners=False)[0]
        Image.fromarray((image.permute(1, 2, 0).numpy() * 255).astype("uint8")).save(tmp_path / f"{i}.png")
    tool = load_tool("merge_fidelity")
    results = tool.main(["--model", "srvit_t_t2", "--set", "embed_dim=64", "num_heads=2", "--checkpoint",
                         str(tmp_path / "model_final.pth"), "--input", str(tmp_path), "--size", "64",
                         "--ratios", "0", "0.5", "--json", str(tmp_path / "out.json")])
    assert set(results[0.5]) == {"unit1", "unit2", "unit3", "last_feat"}
    assert all(r["cosine"] == pytest.approx(1.0) and r["rel_l2"] == 0 for r in results[0.0].values())
    assert all(r["cosine"] < 0.9999 for r in results[0.5].values())
    assert "| 0.5 | unit1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="the checkpoint's recursion depth is T=\\[2\\], the model's T=3"):
        tool.main(["--model", "srvit_t_t3", "--set", "embed_dim=64", "num_heads=2", "--checkpoint",
                   str(tmp_path / "model_final.pth"), "--input", str(tmp_path), "--size", "64"])
