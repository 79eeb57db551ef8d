"""The shared-block layer-id rule (SPEC section 6) on SR-ViT-S T=3, and the weight-decay rule beside
it, as detectron2, mmdet and mmseg apply both."""
import importlib
import os

import pytest
import torch

from helpers import ROOT, lr_and_decay
from srvit_backbones import create_srvit
from srvit_backbones.layer_decay import (
    WEIGHT_DECAY_CONVENTIONS,
    layer_depth,
    layer_id,
    lr_decay_factor,
    weight_decay_exemptions,
)

SIZES_S = [1, 4, 3, 2, 1, 1]  # S-R4-R3-R2-R1-S: 12 unique blocks


@pytest.mark.parametrize("name,expected", [
    ("cls_token", 0), ("pos_embed", 0), ("patch_embed.proj.weight", 0), ("dist_token", 0),
    ("units.0.blocks.0.attn.qkv.weight", 1),          # first ordinary block
    ("units.1.blocks.0.norm1.weight", 2),              # R4: unique blocks 2..5
    ("units.1.blocks.3.mlp.fc2.bias", 5),
    ("units.1.router.weight", 5),                      # router: the unit's last block
    ("units.1.step_transforms.1.weight", 5),
    ("units.2.blocks.0.attn.proj.weight", 6),          # R3: 6..8
    ("units.2.router.bias", 8),
    ("units.3.blocks.1.norm2.weight", 10),             # R2: 9..10
    ("units.4.blocks.0.attn.qkv.bias", 11), ("units.4.step_transforms.0.bias", 11),  # R1
    ("units.5.blocks.0.mlp.fc1.weight", 12),           # last ordinary block
    ("norm.weight", 13), ("head.weight", 13),
])
def test_layer_ids(name, expected):
    assert layer_id(name, SIZES_S) == expected


def test_prefix_and_non_backbone_parameters():
    assert layer_id("backbone.net.srvit.units.1.router.weight", SIZES_S, "backbone.net.srvit.") == 5
    assert layer_id("roi_heads.box_head.fc1.weight", SIZES_S, "backbone.net.srvit.") == 13
    assert layer_id("backbone.simfp_2.0.weight", SIZES_S, "backbone.net.srvit.") == 13
    assert layer_depth("units.0.blocks.0.attn.qkv.weight", SIZES_S) == (1, 14)


def test_every_parameter_of_srvit_s_t3_gets_its_factor():
    model = create_srvit("srvit_s_t3", num_classes=0, img_size=32)
    assert model.unit_sizes == SIZES_S
    factors = {n: lr_decay_factor(n, 0.7, model.unit_sizes) for n, _ in model.named_parameters()}
    assert factors["pos_embed"] == pytest.approx(0.7 ** 13)
    assert factors["units.0.blocks.0.norm1.weight"] == pytest.approx(0.7 ** 12)
    assert factors["units.1.router.weight"] == factors["units.1.blocks.3.attn.qkv.weight"] == pytest.approx(0.7 ** 8)
    assert factors["units.5.blocks.0.mlp.fc2.weight"] == pytest.approx(0.7)
    assert factors["norm.weight"] == 1.0
    # every block parameter's factor follows its unique-block position
    block_index = 0
    for u, unit in enumerate(model.units):
        for k in range(len(unit.blocks)):
            block_index += 1
            for n, _ in unit.blocks[k].named_parameters():
                assert factors[f"units.{u}.blocks.{k}.{n}"] == pytest.approx(0.7 ** (13 - block_index))
    assert model.get_layer_depth("units.3.router.weight") == (10, 14)


def test_unknown_unit_is_an_error():
    with pytest.raises(ValueError, match="unit 9"):
        layer_id("units.9.blocks.0.norm1.weight", SIZES_S)


# ----------------------------------------------------------------------------- the three frameworks
WIDTH, HEADS, SIZE = 32, 2, 64


def detectron2_lr_and_decay(convention):
    """{core parameter name: (lr / base lr, weight decay / base weight decay)} of the shipped
    windowed S-T3 LazyConfig's optimizer, built as tools/train_net.py builds it."""
    from detectron2.config import LazyConfig, instantiate

    cfg = LazyConfig.load(os.path.join(ROOT, "detectron2_configs", "mask_rcnn_srvit_s_t3_win.py"))
    cfg.model.backbone.net.update(img_size=SIZE, embed_dim=WIDTH, num_heads=HEADS, window_size=2)
    cfg.model.backbone.square_pad = SIZE
    cfg.optimizer.params.weight_decay_convention = convention
    model = instantiate(cfg.model)
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    names = {id(p): n for n, p in model.named_parameters()}
    prefix = "backbone.net.srvit."
    return {names[id(p)][len(prefix):]: (g["lr"] / cfg.optimizer.lr, g["weight_decay"] / cfg.optimizer.weight_decay)
            for g in optimizer.param_groups for p in g["params"] if names[id(p)].startswith(prefix)}


def openmmlab_lr_and_decay(framework, config, convention):
    """The same for a shipped mmdet or mmseg config, built by mmengine's build_optim_wrapper."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    registry = importlib.import_module(f"{framework}.registry")
    importlib.import_module(f"srvit_backbones.{framework}")
    importlib.import_module(f"{framework}.utils").register_all_modules(init_default_scope=False)
    cfg = Config.fromfile(os.path.join(ROOT, f"{framework}_configs", config))
    model = cfg.model
    model.backbone.update(img_size=(SIZE, SIZE), embed_dim=WIDTH, num_heads=HEADS, window_size=2)
    model.backbone.pop("init_cfg", None)
    if framework == "mmdet":
        model.neck.in_channels = WIDTH
    else:
        model.neck.in_channels = model.decode_head.in_channels = [WIDTH] * 4
        model.auxiliary_head.in_channels = WIDTH
    cfg.optim_wrapper.type = "OptimWrapper"  # mmengine's AmpOptimWrapper asserts a GPU; the constructor is the same
    cfg.optim_wrapper.paramwise_cfg.update(layer_decay_rate=0.7, weight_decay_convention=convention)
    with DefaultScope.overwrite_default_scope(framework):
        built = registry.MODELS.build(model)
        groups = lr_and_decay(built, cfg.optim_wrapper)
    lr, wd = cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.weight_decay
    prefix = "backbone.srvit."
    return {n[len(prefix):]: (g_lr / lr, g_wd / wd) for n, (g_lr, g_wd) in groups.items() if n.startswith(prefix)}


@pytest.mark.parametrize("convention", sorted(WEIGHT_DECAY_CONVENTIONS))
def test_detectron2_mmdet_and_mmseg_give_every_backbone_parameter_the_rules_lr_and_decay(convention):
    """Each framework's windowed S-T3 config, told the same convention and layer decay 0.7,
    gives every backbone parameter the same (lr scale, weight-decay scale), and that is the
    rule of srvit_backbones.layer_decay: the shared-block factor; no weight decay on the core's
    no_weight_decay() names (position table, class token, rel-pos tables) nor on the kinds the
    convention exempts (norms; biases), the routers and step transforms as any Linear layer."""
    detectron2 = detectron2_lr_and_decay(convention)
    mmdet = openmmlab_lr_and_decay("mmdet", "mask_rcnn_srvit_s_t3_win_lsj.py", convention)
    mmseg = openmmlab_lr_and_decay("mmseg", "upernet_srvit_s_win.py", convention)
    # the segmentation backbone stops after the last recursive unit (units.5 is not built)
    assert mmdet.keys() == detectron2.keys()
    assert mmseg.keys() == {n for n in detectron2 if not n.startswith("units.5.")}

    core = create_srvit("srvit_s_t3", img_size=SIZE, embed_dim=WIDTH, num_heads=HEADS, window_size=2,
                        use_rel_pos=True, num_classes=0)
    no_decay = core.no_weight_decay()
    exempt = weight_decay_exemptions(convention)
    modules = dict(core.named_modules())
    kinds = {"norm": 0, "bias": 0, "position": 0, "weight": 0}
    for name, (lr_scale, decay_scale) in detectron2.items():
        is_norm = isinstance(modules[name.rsplit(".", 1)[0]] if "." in name else core, torch.nn.LayerNorm)
        kind = ("position" if name in no_decay else "norm" if is_norm else "bias" if name.endswith(".bias")
                else "weight")
        kinds[kind] += 1
        expected = (lr_decay_factor(name, 0.7, SIZES_S), 0.0 if kind == "position" or kind in exempt else 1.0)
        assert (lr_scale, decay_scale) == pytest.approx(expected), name
        assert mmdet[name] == pytest.approx(expected), name
        assert mmseg.get(name, expected) == pytest.approx(expected), name
    assert all(kinds.values()) and kinds["position"] == 1 + 2 * 16, kinds  # pos_embed, 16 blocks' h and w tables
