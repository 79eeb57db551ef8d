"""timm's model contract for every registered ``srvit_*`` variant, checked the way timm's own
``tests/test_models.py`` checks its models: forward, backward, default cfg (the ``non_std``
form timm applies to ``vit_*`` / ``deit*``), features_only, forward_intermediates,
TorchScript, FX forward / backward / FX+TorchScript (timm's ``_create_fx_model``), plus
``torch.export`` of the dense backbone with dynamic height and width.

timm's checks mostly stop at shapes and NaNs; here traced and scripted outputs are compared
with eager by value. To keep the file fast, every variant keeps its layout and T but is built
at width 32 with 2 heads and a 2x2 pretraining grid (``tiny``); inputs of 64x48 then exercise
the position-table resize and 32x32 the pretraining grid. At that size the B variants are the
S ones (and DeiT-B is DeiT-S), so the tracing checks run once per distinct structure
(``STRUCTURES``, ids naming the variants covered), on one FX trace each. The default-cfg names
are checked at full size too (model creation only).
"""
import copy
import functools
import math

import pytest
import timm
import torch
from timm import set_scriptable
from timm.models import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import NodePathTracer, create_feature_extractor, get_graph_node_names

import srvit_backbones  # noqa: F401  (registers the variants)
from helpers import randomize_routers
from srvit_backbones.models import VARIANTS

NAMES = sorted(VARIANTS)


def _structures():
    """One variant per (layout, T), with the names of all variants of that structure."""
    groups = {}
    for name in NAMES:
        groups.setdefault((VARIANTS[name]["layout"], VARIANTS[name]["num_steps"]), []).append(name)
    return [pytest.param(names[0], id="=".join(names)) for names in groups.values()]


STRUCTURES = _structures()
SIZES = [(64, 48), (32, 32)]  # a resized position table, then the pretraining grid


def tiny(name, **kw):
    """The variant's structure (layout, T, distillation) at width 32 and a 2x2 pretraining grid,
    with random routers and step transforms (zero-initialised ones would mix uniformly and
    hide a wrongly ordered mixture)."""
    model = timm.create_model(name, img_size=32, embed_dim=32, num_heads=2, **kw)
    torch.manual_seed(0)
    return randomize_routers(model)


def images(size, batch=1, seed=0):
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


def _tracer_kwargs():
    """timm's FX settings: its leaf modules and notrace functions (our checks and the resize
    are registered there), parameter shapes as constants."""
    return dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
                param_shapes_constant=True)


def fx_model(model, train=False):
    """timm's ``_create_fx_model``: an FX feature extractor returning the model's output node
    (in train mode, the nodes that feed the output)."""
    kwargs = _tracer_kwargs()
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=kwargs)
    train_return_nodes = [train_nodes[-1]]
    if train:
        graph = NodePathTracer(**kwargs).trace(model)
        graph_nodes = list(reversed(graph.nodes))
        output_node_names = [n.name for n in graph_nodes[0]._input_nodes.keys()]
        graph_node_names = [n.name for n in graph_nodes]
        train_return_nodes = [train_nodes[-graph_node_names.index(n)] for n in output_node_names]
    return create_feature_extractor(model, train_return_nodes=train_return_nodes,
                                    eval_return_nodes=[eval_nodes[-1]], tracer_kwargs=kwargs)


@functools.lru_cache(maxsize=None)
def traced(name):
    """(model, its FX graph built as timm's train-mode ``_create_fx_model``), once per variant:
    the tests set the mode they need."""
    model = tiny(name)
    return model, fx_model(model, train=True)


def fx_output(fx, x):
    return torch.cat(tuple(fx(x).values()))


def check_dense(outputs, model_or_info, size, batch):
    """timm's shape rules for feature maps: channels and reduction of ``feature_info``."""
    info = model_or_info if isinstance(model_or_info, timm.models.FeatureInfo) else model_or_info.feature_info
    assert len(outputs) == len(info.channels())
    for c, r, o in zip(info.channels(), info.reduction(), outputs):
        assert o.shape[0] == batch and o.shape[1] == c
        assert o.shape[2] <= math.ceil(size[0] / r) + 1 and o.shape[3] <= math.ceil(size[1] / r) + 1
        assert not torch.isnan(o).any()


def randomize_rel_pos(model):
    """Relative-position tables drawn at random: zero-initialised ones add no bias and would
    hide a table used at the wrong application."""
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "rel_pos" in n:
                p.normal_(0, 0.3)
    return model


def output_and_saved_tensors(model, x):
    """``model(x)`` and how many tensors autograd saved for its backward pass."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(1) or t, lambda t: t):
        out = model(x)
    return out, len(saved)


# every variant, and the options that take other paths through a checkpointed application:
# windows with relative positions (padded to whole windows at 64x48), token merging's bias
CHECKPOINTED = [pytest.param(name, {}, id=name) for name in NAMES] + [
    pytest.param("srvit_t_t2", dict(window_size=2, use_rel_pos=True), id="srvit_t_t2-windows_rel_pos"),
    pytest.param("srvit_t_t3", dict(token_merge_ratio=0.5), id="srvit_t_t3-token_merging")]


# ----------------------------------------------------------------------------- eager contract
@pytest.mark.parametrize("name,options", CHECKPOINTED)
def test_forward_and_grad_checkpointing(name, options):
    """Gradient checkpointing gives the plain model's output and gradients (drop-path masks
    included: the recomputation must draw the forward pass's). Compared with grad enabled, where
    the units checkpoint each block application (under no_grad they run the plain path); that
    the checkpointed path ran shows as fewer tensors saved for the backward pass."""
    plain = randomize_rel_pos(tiny(name, drop_path_rate=0.2, **options)).train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing()
    x = images(SIZES[0], batch=2)
    torch.manual_seed(2)
    out, saved_plain = output_and_saved_tensors(plain, x)
    torch.manual_seed(2)
    out_checkpointed, saved_checkpointed = output_and_saved_tensors(checkpointed, x)
    assert out.shape == (2, 1000) and not torch.isnan(out).any()
    assert saved_checkpointed < saved_plain / 2, (saved_checkpointed, saved_plain)
    torch.testing.assert_close(out_checkpointed, out)
    out.square().sum().backward()
    out_checkpointed.square().sum().backward()
    grads = dict(checkpointed.named_parameters())
    for n, p in plain.named_parameters():
        assert p.grad is not None and grads[n].grad is not None, n
        torch.testing.assert_close(grads[n].grad, p.grad, msg=n)


@pytest.mark.parametrize("name", NAMES)
def test_backward_reaches_every_parameter(name):
    model = tiny(name, num_classes=42).train()
    out = model(images(SIZES[0], batch=2))
    assert out.shape == (2, 42)
    out.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("name", NAMES)
def test_default_cfg_full_size(name):
    """timm's cfg names at the registered size: classifier and first conv exist, the input
    settings are the ImageNet ones (built on the meta device: names and shapes, no weights drawn)."""
    with torch.device("meta"):
        model = timm.create_model(name)
    cfg = model.pretrained_cfg
    state = model.state_dict()
    assert model.num_classes == cfg["num_classes"] == 1000
    assert model.num_features == model.head_hidden_size == VARIANTS[name]["embed_dim"]
    assert cfg["input_size"] == (3, 224, 224) and cfg["fixed_input_size"] is False
    assert cfg["mean"] == timm.data.IMAGENET_DEFAULT_MEAN and cfg["std"] == timm.data.IMAGENET_DEFAULT_STD
    assert cfg["interpolation"] == "bicubic" and cfg["crop_pct"] == 0.875
    classifiers = cfg["classifier"] if isinstance(cfg["classifier"], (tuple, list)) else (cfg["classifier"],)
    for c in classifiers:
        assert c + ".weight" in state
    assert cfg["first_conv"] + ".weight" in state


@pytest.mark.parametrize("name", NAMES)
def test_default_cfg_outputs(name):
    """timm's ``test_model_default_cfgs_non_std``: token features of ``num_features``,
    pre-logits of ``head_hidden_size``; without a classifier the output is the pre-logits."""
    model = tiny(name).eval()
    x = images(SIZES[0])
    with torch.no_grad():
        feats = model.forward_features(x)
        pre = model.forward_head(feats, pre_logits=True)
        assert feats.shape == (1, model.num_prefix_tokens + 4 * 3, model.num_features)
        assert pre.shape == (1, model.head_hidden_size)
        model.reset_classifier(0)
        assert model.num_classes == 0
        torch.testing.assert_close(model(x), pre)
        assert tiny(name, num_classes=0).eval()(x).shape == (1, model.num_features)


@pytest.mark.parametrize("name", NAMES)
def test_features_only_and_intermediates(name):
    """timm's features tests: ``features_only`` (the getter over ``forward_intermediates``)
    and ``forward_intermediates`` give ``feature_info``'s maps, equal to
    ``forward_feature_maps`` for the same weights; the final output equals
    ``forward_features``, also with gradient checkpointing."""
    model = tiny(name, num_classes=0).eval()
    backbone = tiny(name, features_only=True, feature_cls="getter").eval()
    assert not backbone.model.load_state_dict(model.state_dict(), strict=False).missing_keys
    out_indices = backbone.feature_info.out_indices
    for size in SIZES:
        x = images(size)
        with torch.no_grad():
            maps = backbone(x)
            check_dense(maps, backbone, size, 1)
            reference = model.forward_feature_maps(x, indices=out_indices)
            for i, m in zip(out_indices, maps):
                torch.testing.assert_close(m, reference[model.feature_name(i)], rtol=0, atol=0)
            final, inter = model.forward_intermediates(x)
            check_dense(inter, timm.models.FeatureInfo(model.feature_info, len(model.feature_info)), size, 1)
            torch.testing.assert_close(final, model.forward_features(x), rtol=0, atol=0)
        # with grad enabled, where the units checkpoint (under no_grad they run the plain path)
        model.set_grad_checkpointing()
        checkpointed_final, checkpointed_inter = model.forward_intermediates(x)
        model.set_grad_checkpointing(False)
        torch.testing.assert_close(checkpointed_final, final)
        for got, expected in zip(checkpointed_inter, inter, strict=True):
            torch.testing.assert_close(got, expected)


# ----------------------------------------------------------------------------- TorchScript
@pytest.mark.parametrize("name", STRUCTURES)
def test_torchscript_equals_eager(name):
    with set_scriptable(True):
        model = tiny(name).eval()
    scripted = torch.jit.script(model)
    with torch.no_grad():
        for size in SIZES:
            x = images(size)
            torch.testing.assert_close(scripted(x), model(x))
    with pytest.raises(torch.jit.Error, match="40x32 is not a multiple of the patch size 16: pad"):
        scripted(images((40, 32)))


def test_torchscript_training_drop_path_equals_eager():
    """The scripted block applications use each application's own drop-path rate: with one
    seed, scripted and eager training outputs match."""
    model = tiny("srvit_s_t3", drop_path_rate=0.5).train()
    scripted = torch.jit.script(model)
    x = images(SIZES[0], batch=4)
    torch.manual_seed(3)
    eager = model(x)
    torch.manual_seed(3)
    torch.testing.assert_close(scripted(x), eager)
    torch.manual_seed(4)
    assert not torch.allclose(model(x), eager)  # the masks act: another seed, another output


# ----------------------------------------------------------------------------- FX
@pytest.mark.parametrize("name", STRUCTURES)
def test_fx_forward_equals_eager(name):
    """timm's ``test_model_forward_fx``: the traced graph gives exactly the eager output, here
    at two input sizes (one trace: the size checks and the resize decision are leaves)."""
    model, fx = traced(name)
    model.eval(), fx.eval()
    with torch.no_grad():
        for size in SIZES:
            x = images(size)
            assert torch.equal(fx_output(fx, x), model(x))
        with pytest.raises(ValueError, match="40x32 is not a multiple of the patch size 16: pad"):
            fx(images((40, 32)))


@pytest.mark.parametrize("name", STRUCTURES)
def test_fx_backward_reaches_every_parameter(name):
    """timm's ``test_model_backward_fx``."""
    model, fx = traced(name)
    fx.train()
    fx.zero_grad(set_to_none=True)
    out = fx_output(fx, images(SIZES[0], batch=2))
    assert out.shape == (2, model.num_classes)
    out.mean().backward()
    missing = [n for n, p in fx.named_parameters() if p.grad is None]
    assert not missing, missing
    assert sum(p.numel() for p in fx.parameters()) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", STRUCTURES)
def test_fx_then_torchscript_equals_eager(name):
    """timm's ``test_model_forward_fx_torchscript``: the FX graph, scripted (the leaf functions
    are scriptable)."""
    model, fx = traced(name)
    model.eval(), fx.eval()
    scripted = torch.jit.script(fx)
    with torch.no_grad():
        for size in SIZES:
            x = images(size)
            torch.testing.assert_close(fx_output(scripted, x), model(x))


def test_fx_feature_extraction_of_unit_outputs():
    """timm's FX feature class (``features_only=True, feature_cls='fx'``: a graph returning the
    ``feature_info`` modules, the units' token outputs), eager and scripted, equals the unit
    outputs of ``forward_intermediates`` (tokens, prefix included)."""
    assert isinstance(tiny("srvit_s_t2", features_only=True, feature_cls="fx"), timm.models.FeatureGraphNet)
    model = tiny("srvit_s_t2", num_classes=0).eval()
    indices = [1, 2, 3, 4]
    fx_backbone = timm.models.FeatureGraphNet(model, out_indices=indices).eval()
    scripted = torch.jit.script(fx_backbone)
    for size in SIZES:
        x = images(size)
        with torch.no_grad():
            units = [torch.cat([prefix, feat], 1) for feat, prefix in model.forward_intermediates(
                x, indices, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True)]
            for out in (fx_backbone(x), scripted(x)):
                assert len(out) == len(indices)
                for tokens, expected in zip(out, units):
                    torch.testing.assert_close(tokens, expected, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- torch.export
def test_export_dense_backbone_with_dynamic_size():
    """``torch.export`` of the ``features_only`` backbone with dynamic batch, height and width
    (multiples of 16), checked by value at sizes other than the example's, the pretraining
    grid among them (the resize is not specialised away)."""
    backbone = tiny("srvit_t_t2", features_only=True).eval()
    h, w = torch.export.Dim("h", min=1, max=64), torch.export.Dim("w", min=1, max=64)
    program = torch.export.export(backbone, (images((64, 48), batch=2),),
                                  dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=16),
                                                        2: 16 * h, 3: 16 * w}})
    exported = program.module()
    for batch, size in [(1, (96, 32)), (2, (32, 32)), (3, (48, 80))]:
        x = images(size, batch=batch)
        with torch.no_grad():
            for a, b in zip(exported(x), backbone(x)):
                torch.testing.assert_close(a, b)
    with pytest.raises(AssertionError, match="% 16 == 0"):
        exported(images((40, 32)))


class FeatureMaps(torch.nn.Module):
    """``forward_feature_maps`` with mixtures as a module, for ``torch.export``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model.forward_feature_maps(x, return_mixture=True)


def test_export_feature_maps_with_mixtures():
    """The adapters' dense API (unit maps, ``last_feat``, mixture weights), hard aggregation
    (argmax and scatter) included, exports with dynamic size and matches eager."""
    model = tiny("srvit_t_t3", aggregation="hard", num_classes=0).eval()
    h, w = torch.export.Dim("h", min=1, max=64), torch.export.Dim("w", min=1, max=64)
    exported = torch.export.export(FeatureMaps(model), (images((64, 48), batch=2),),
                                   dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=16),
                                                         2: 16 * h, 3: 16 * w}}).module()
    for batch, size in [(1, (32, 32)), (3, (96, 32))]:
        x = images(size, batch=batch)
        with torch.no_grad():
            expected, got = model.forward_feature_maps(x, return_mixture=True), exported(x)
        assert sorted(got) == sorted(expected) == ["last_feat", "mixture1", "mixture2", "mixture3",
                                                   "unit1", "unit2", "unit3"]
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], msg=key)


# ----------------------------------------------------------------------------- windowed mode
@pytest.mark.parametrize("use_rel_pos", [False, True], ids=["windows", "windows_rel_pos"])
def test_windowed_model_traces_with_fx_and_refuses_torchscript(use_rel_pos):
    """ViTDet's options: FX traces them (padding to whole windows at an input size the trace
    did not see included); TorchScript is refused with a message that names the alternatives."""
    model = tiny("srvit_t_t2", window_size=2, use_rel_pos=use_rel_pos).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "rel_pos" in n:
                p.normal_(0, 0.3)
    fx = fx_model(model)
    with torch.no_grad():
        for size in [(64, 48), (48, 80)]:  # grids 4x3 and 3x5: padded to 4x4 and 4x6
            x = images(size, batch=2)
            assert torch.equal(fx_output(fx, x), model(x))
    with pytest.raises(RuntimeError, match="global attention only.*torch.fx, or torch.export at a fixed input size"):
        torch.jit.script(model)
