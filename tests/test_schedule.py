"""The schedule of block applications (models/schedule.py) is the one statement of which block
runs where: its numbering, rates, windows and features, and every part of the model reads it
(units, global applications, relative-position tables, features), also after a change of
depth and a pruning."""
import math

import pytest
import timm
import torch

import srvit_backbones  # noqa: F401  (registers the variants)
from srvit_backbones.models import SRViT, build_schedule, default_global_attn_indexes, default_out_indices
from srvit_backbones.models.schedule import unit_plan


def test_srvit_s_t3_schedule():
    plan = unit_plan((4, 3, 2, 1), 3)
    assert plan == [(1, 1), (4, 3), (3, 3), (2, 3), (1, 3), (1, 1)]
    globals_ = default_global_attn_indexes((4, 3, 2, 1), 3)
    assert globals_ == (1, 13, 22, 28, 31)
    schedule = build_schedule((4, 3, 2, 1), 3, drop_path_rate=0.1, window_size=14, global_attn_indexes=globals_)
    assert schedule.plan == tuple(plan) and schedule.recursive_units == (1, 2, 3, 4) and not schedule.pruned
    apps = schedule.applications
    assert schedule.depth == 32 and [a.index for a in apps] == list(range(32))
    # unit 1 (K=4, T=3), step-major: applications 1..12
    assert [(a.step, a.block) for a in schedule.of_unit(1)] == [(t, k) for t in range(3) for k in range(4)]
    assert [a.index for a in schedule.of_unit(1)] == list(range(1, 13))
    torch.testing.assert_close(torch.tensor([a.drop_path_rate for a in apps]), torch.linspace(0, 0.1, 32))
    assert schedule.global_indexes == globals_
    assert [a.window_size for a in apps if a.index not in globals_] == [14] * 27
    # block 0 of unit 1 runs globally at step 0 and windowed after; block 1 only windowed
    assert schedule.extents(1, 0) == (14, True) and schedule.extents(1, 1) == (14, False)
    assert schedule.features == ((0, -1), (1, -1), (2, -1), (3, -1), (4, -1), (5, -1))
    cut = schedule.restricted([(1, 1), (4, 3), (3, 2)])
    assert cut.depth == 1 + 12 + 6 and cut.applications == apps[:19]
    assert cut.pruned and cut.recursive_units == (1, 2) and cut.features == schedule.features[:3]


def test_bvit_features_count_steps_and_the_deit_layout_keeps_vitdets_global_blocks():
    assert default_global_attn_indexes((1,) * 10, 1) == (2, 5, 8, 11)  # ViTDet's, for DeiT
    schedule = build_schedule((1,), 12, ordinary_blocks=False, step_features=True)
    assert schedule.features == tuple((0, t) for t in range(12)) and schedule.global_indexes == tuple(range(12))
    assert default_global_attn_indexes((1,), 12, ordinary_blocks=False, step_features=True) == (2, 5, 8, 11)


def executed_applications(model, x):
    """What one training forward pass of ``model`` on ``x`` runs, observed from outside the
    units, one entry per block application in the order they run: (unit, block, window, drop-path
    rate). The window is the extent of attention: the tokens the attention output of the first
    patch token depends on (autograd, on the live graph), a side of that many if they are fewer
    than all, else 0 (global). The rate is read off the attention branch's residual: drop-path
    keeps a sample's branch scaled by 1 / (1 - rate) or drops it, so ``rate = 1 - 1 / scale``
    on a kept sample."""
    records, handles = [], []

    def hook(name, unit, block):
        def record(module, args, output=None):
            if name == "norm1":
                records.append(dict(unit=unit, block=block, block_input=args[0]))
            elif name == "ls1":
                records[-1]["branch"] = output
            else:
                records[-1][name] = args[0]
        return record

    for u, unit in enumerate(model.units):
        for k, block in enumerate(unit.blocks):
            for name, module in (("norm1", block.norm1), ("qkv", block.attn.qkv), ("proj", block.attn.proj),
                                 ("norm2", block.norm2)):
                handles.append(module.register_forward_pre_hook(hook(name, u, k)))
            handles.append(block.ls1.register_forward_hook(hook("ls1", u, k)))
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    prefix = model.num_prefix_tokens
    executed = []
    for r in records:
        reached = torch.autograd.grad(r["proj"][0, prefix].sum(), r["qkv"], retain_graph=True)[0]
        attended = int(reached[0].abs().sum(-1).gt(0).sum())
        window = 0 if attended == r["qkv"].shape[1] else math.isqrt(attended)
        assert window == 0 or window * window == attended, attended
        with torch.no_grad():
            residual, branch = (r["norm2"] - r["block_input"]).flatten(1), r["branch"].flatten(1)
            scale = (residual * branch).sum(1) / branch.square().sum(1)  # per sample: 0 or 1 / (1 - rate)
        kept = scale[scale > 0.5]
        assert len(kept) and torch.allclose(kept, kept[0], rtol=1e-4), scale
        executed.append((r["unit"], r["block"], window, 1 - 1 / kept[0].item()))
    return executed


@pytest.mark.parametrize("options", [dict(), dict(window_size=2, use_rel_pos=True),
                                     dict(window_size=2, global_attn_indexes=(0, 3))])
def test_the_model_runs_its_schedule(options):
    """A forward pass runs every application of the schedule, in its order, each with its own
    window and drop-path rate (observed in the run, not read from the units' settings), and
    the blocks hold the relative-position tables of the windows they run at."""
    torch.manual_seed(0)
    model = SRViT(img_size=64, embed_dim=32, num_heads=2, layout=(2, 1), num_steps=3, drop_path_rate=0.3,
                  **options).train()
    schedule = model.schedule
    assert model.effective_depth == schedule.depth == 2 + 3 * 3
    assert model.global_attn_indexes == schedule.global_indexes
    assert model.feature_points == list(schedule.features)
    if options:  # the windows under test: windowed and global applications of one shared block
        assert len({a.window_size for a in schedule.of_unit(1) if a.block == 0}) == 2
    executed = executed_applications(model, torch.randn(4, 3, 64, 64))
    expected = [(a.unit, a.block, a.window_size, a.drop_path_rate) for a in schedule.applications]
    assert [e[:3] for e in executed] == [e[:3] for e in expected]
    assert [e[3] for e in executed] == pytest.approx([e[3] for e in expected], abs=1e-4)
    for u, unit in enumerate(model.units):
        for k, block in enumerate(unit.blocks):
            window, has_global = schedule.extents(u, k)
            if options.get("use_rel_pos"):
                assert hasattr(block.attn, "window_rel_pos_h") == bool(window)
                assert hasattr(block.attn, "global_rel_pos_h") == has_global


def test_a_change_of_depth_and_a_pruning_keep_the_schedule_in_step():
    model = timm.create_model("bvit_s", img_size=32, drop_path_rate=0.2)
    model.set_num_steps(6)
    assert model.schedule.depth == model.effective_depth == 6
    assert model.units[0].drop_path_rates == [a.drop_path_rate for a in model.schedule.applications]
    torch.testing.assert_close(torch.tensor(model.units[0].drop_path_rates), torch.linspace(0, 0.2, 6))
    model.prune_intermediate_layers(indices=[1, 3])
    assert model.units[0].num_steps == 4 and model.schedule.depth == model.effective_depth == 4
    assert model.feature_points == list(model.schedule.features) == [(0, t) for t in range(4)]


def test_dense_heads_take_four_features_the_recursive_units_or_the_quarters():
    """``default_out_indices``: the recursive units where there are at most four (SR-ViT), else
    the quarters of the network (ViTDet's rule), for any layout, not only DeiT's."""
    assert default_out_indices((4, 3, 2, 1), 3) == (1, 2, 3, 4)
    assert default_out_indices((3, 2, 1), 2) == (1, 2, 3)
    assert default_out_indices((1,) * 10, 1) == (2, 5, 8, 11)  # DeiT: layers 3/6/9/12
    assert default_out_indices((2,) * 6, 2) == (1, 3, 5, 7)  # 8 units: the quarters
    assert default_out_indices((1,), 12, ordinary_blocks=False) == (0,)
    assert default_out_indices((1,), 12, ordinary_blocks=False, step_features=True) == (2, 5, 8, 11)
    model = SRViT(img_size=32, embed_dim=32, num_heads=2, layout=(1,) * 6, num_steps=1, window_size=1)
    assert model.default_feature_indices == (1, 3, 5, 7)
    assert model.global_attn_indexes == (1, 3, 5, 7)  # the first applications of those units, and the last


def test_a_new_depth_is_a_new_schedule_of_the_same_arguments():
    schedule = build_schedule((2, 1), 3, drop_path_rate=0.2, window_size=2)
    deeper = schedule.with_num_steps(5)
    assert deeper.num_steps == 5 and deeper.plan == ((1, 1), (2, 5), (1, 5), (1, 1))
    assert deeper == build_schedule((2, 1), 5, drop_path_rate=0.2, window_size=2)
    with pytest.raises(ValueError, match="global_attn_indexes number the block applications of one depth"):
        build_schedule((2, 1), 3, window_size=2, global_attn_indexes=(0,)).with_num_steps(2)
    with pytest.raises(ValueError, match="global_attn_indexes number the block applications of one depth"):
        schedule.restricted(schedule.plan[:2]).with_num_steps(2)
    with pytest.raises(ValueError, match=r"num_steps \(T\) must be an integer >= 1, got True"):
        schedule.with_num_steps(True)


def test_the_model_keeps_no_copy_of_what_its_schedule_says():
    """Depth, windows, feature points and recursive units are read from the schedule, so a new
    depth or a pruning cannot leave one of them behind."""
    model = SRViT(img_size=32, embed_dim=32, num_heads=2, layout=(2, 1), num_steps=3, window_size=1)
    derived = dict(num_steps=3, layout=(2, 1), window_size=1, effective_depth=11, recursive_unit_indices=(1, 2),
                   global_attn_indexes=model.schedule.global_indexes, feature_points=list(model.schedule.features))
    assert {name: getattr(model, name) for name in derived} == derived
    for name in derived:
        with pytest.raises(AttributeError):
            setattr(model, name, None)
    model.prune_intermediate_layers(indices=[1])
    assert model.recursive_unit_indices == (1,) and model.effective_depth == 7 and len(model.feature_info) == 2
