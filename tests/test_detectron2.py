"""Detectron2: the SR-ViT Mask R-CNN configs, the checkpointer, and tools/train_net.py end to end."""
import glob
import json
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
import torch
from detectron2.config import LazyConfig, get_cfg, instantiate
from detectron2.engine import AMPTrainer, SimpleTrainer, hooks
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_model
from detectron2.structures import BitMasks, Instances
from detectron2.utils.events import EventStorage
from omegaconf import OmegaConf

import srvit_backbones
from helpers import (
    child_pids,
    divergence_report,
    file_size_limit,
    free_port,
    interpolated_pos_embed,
    kill_machine_1_beside_one_machine,
    load_tool,
    two_gloo_processes,
)
from srvit_backbones import CheckpointError, ConfigError, create_srvit, load_pretrained
from srvit_backbones.detectron2 import (
    SRViTBackbone,
    SRViTCheckpointer,
    add_srvit_config,
    srvit_optimizer_params,
    train_net,
    validate_config,
)
from srvit_backbones.layer_decay import lr_decay_factor
from srvit_backbones.models.attention import RelPosAttention
from srvit_backbones.models.rel_pos import is_rel_pos
from srvit_backbones.models.srvit import resize_pos_embed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "detectron2_configs")
QUICKSTART = os.path.join(CONFIGS, "quickstart", "mask_rcnn_srvit_tiny_cpu.py")
S_T3 = os.path.join(CONFIGS, "mask_rcnn_srvit_s_t3.py")
# every shipped Mask R-CNN config (quickstart/ included), found by glob: a new one is covered
# unedited; cascade/ and lvis/ (other heads, LVIS data) have their own sweep, ZOO, below
ZOO_FOLDERS = ("cascade", "lvis")
SHIPPED = sorted(p for p in glob.glob(os.path.join(CONFIGS, "**", "*.py"), recursive=True)
                 if os.path.relpath(p, CONFIGS).split(os.sep)[0] not in ("common", *ZOO_FOLDERS))
ZOO = sorted(p for folder in ZOO_FOLDERS
             for p in glob.glob(os.path.join(CONFIGS, folder, "**", "*.py"), recursive=True))
PREFIX = "backbone.net.srvit."

# Shrinks any shipped config to a 64-wide backbone, 64-channel pyramid and heads, 64-pixel
# images, CPU and no checkpoint (the quickstart config's recipe, smaller).
TINY = [
    "model.backbone.net.img_size=64", "model.backbone.net.embed_dim=64", "model.backbone.net.num_heads=2",
    "model.backbone.square_pad=64", "model.backbone.out_channels=64", "model.proposal_generator.head.in_channels=64",
    "model.roi_heads.box_head.input_shape.channels=64", "model.roi_heads.box_head.conv_dims=[64,64]",
    "model.roi_heads.box_head.fc_dims=[64]", "model.roi_heads.box_predictor.input_shape.channels=64",
    "model.roi_heads.mask_head.input_shape.channels=64", "model.roi_heads.mask_head.conv_dims=[64,64]",
    "model.roi_heads.batch_size_per_image=64",
    "dataloader.train.mapper.augmentations.1.min_scale=0.5", "dataloader.train.mapper.augmentations.1.max_scale=1.5",
    "dataloader.train.mapper.augmentations.1.target_height=64",
    "dataloader.train.mapper.augmentations.1.target_width=64",
    "dataloader.train.mapper.augmentations.2.crop_size=[64,64]",
    "dataloader.test.mapper.augmentations.0.short_edge_length=64", "dataloader.test.mapper.augmentations.0.max_size=64",
    "dataloader.train.total_batch_size=2", "dataloader.train.num_workers=0", "dataloader.test.num_workers=0",
    "train.device=cpu", "train.amp.enabled=False", "train.init_checkpoint=''",
]

# paper Table 4, whole detector (M)
TABLE4 = {"mask_rcnn_deit_s.py": 45.9, "mask_rcnn_srvit_s_t2.py": 46.5, "mask_rcnn_srvit_s_t3.py": 47.1,
          "mask_rcnn_srvit_s_t4.py": 47.7, "mask_rcnn_srvit_b_t2.py": 64.7, "mask_rcnn_srvit_b_t3.py": 65.8}


def load(name):
    return LazyConfig.load(os.path.join(CONFIGS, name))


@pytest.mark.parametrize("name,params", list(TABLE4.items()))
def test_detector_parameters_match_table4(name, params):
    """Counted on the meta device: the detector's shapes, no weights drawn."""
    cfg = load(name)
    assert cfg.model.backbone.net.img_size == 1024 and cfg.model.backbone.square_pad == 1024
    with torch.device("meta"):
        model = instantiate(cfg.model)
    assert model.backbone.net.srvit.pos_embed.shape[1] == 64 * 64 + 1
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - params) < 0.2


def test_every_variant_config_exists_and_holds_the_recipe():
    names = [f"mask_rcnn_srvit_{v}.py" for v in ("t_t2", "t_t3", "s_t2", "s_t3", "s_t4", "b_t2", "b_t3")]
    assert set(names + ["mask_rcnn_deit_s.py"]) <= set(srvit_backbones.list_configs("detectron2"))
    cfg = load("mask_rcnn_srvit_s_t3.py")
    assert cfg.model.backbone.net.variant == "srvit_s_t3"
    assert cfg.train.max_iter == 270000 and cfg.dataloader.train.total_batch_size == 16
    assert cfg.optimizer.lr == 1e-4 and cfg.optimizer._target_ is torch.optim.AdamW
    assert cfg.train.amp.enabled
    assert cfg.lr_multiplier.warmup_length * cfg.train.max_iter == pytest.approx(1000)
    crop = [a for a in cfg.dataloader.train.mapper.augmentations if "crop_size" in a][0]
    assert tuple(crop.crop_size) == (1024, 1024)
    assert tuple(cfg.model.backbone.scale_factors) == (4.0, 2.0, 1.0, 0.5) and cfg.model.backbone.out_channels == 256
    assert cfg.model.backbone.norm == "LN"


def test_layer_decay_groups_every_backbone_parameter():
    """The full-size detector's optimizer groups, built on the meta device (no weights drawn)."""
    cfg = load("mask_rcnn_srvit_s_t3.py")
    with torch.device("meta"):
        model = instantiate(cfg.model)
    cfg.optimizer.params.model = model
    optim = instantiate(cfg.optimizer)
    lr_of = {}
    for group in optim.param_groups:
        for p in group["params"]:
            lr_of[id(p)] = group["lr"]
    sizes = [1, 4, 3, 2, 1, 1]
    expected = {
        "backbone.net.srvit.pos_embed": 0.7 ** 13,
        "backbone.net.srvit.patch_embed.proj.weight": 0.7 ** 13,
        "backbone.net.srvit.units.0.blocks.0.attn.qkv.weight": 0.7 ** 12,
        "backbone.net.srvit.units.1.blocks.0.attn.qkv.weight": 0.7 ** 11,
        "backbone.net.srvit.units.1.router.weight": 0.7 ** 8,
        "backbone.net.srvit.units.1.step_transforms.1.weight": 0.7 ** 8,
        "backbone.net.srvit.units.4.router.weight": 0.7 ** 2,
        "backbone.net.srvit.units.5.blocks.0.mlp.fc2.weight": 0.7,
        "backbone.simfp_2.0.weight": 1.0,
        "roi_heads.box_predictor.cls_score.weight": 1.0,
    }
    params = dict(model.named_parameters())
    for name, factor in expected.items():
        assert lr_of[id(params[name])] == pytest.approx(1e-4 * factor), name
    for name, p in params.items():  # and every other parameter follows the one rule
        assert lr_of[id(p)] == pytest.approx(1e-4 * lr_decay_factor(name, 0.7, sizes, "backbone.net.srvit.")), name


def tiny(path, *overrides):
    return LazyConfig.apply_overrides(LazyConfig.load(path), TINY + list(overrides))


@pytest.mark.parametrize("override,unit_sizes", [
    ("model.backbone.net.layout=[2,2]", [1, 2, 2, 1]),
    ("model.backbone.net.layout=fine_grained", [1] * 12),
    ("model.backbone.net.num_steps=2", [1, 4, 3, 2, 1, 1]),
    ("model.backbone.net.variant=srvit_t_t3", [1, 3, 2, 1, 1]),
    ("model.backbone.net.distilled=True", [1, 4, 3, 2, 1, 1]),
])
def test_layer_decay_follows_the_built_backbone(override, unit_sizes):
    cfg = tiny(S_T3, override)
    model = instantiate(cfg.model)
    built = model.backbone.net.srvit
    assert built.unit_sizes == unit_sizes
    cfg.optimizer.params.model = model
    optim = instantiate(cfg.optimizer)
    group_of = {id(p): g for g in optim.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert group_of[id(p)]["lr"] == pytest.approx(1e-4 * lr_decay_factor(name, 0.7, unit_sizes, PREFIX)), name
    no_decay = built.no_weight_decay()
    checked = set()
    for name, p in built.named_parameters():
        if name in no_decay:
            assert group_of[id(p)]["weight_decay"] == 0.0, name
            checked.add(name)
        elif name.endswith("qkv.weight"):
            assert group_of[id(p)]["weight_decay"] == cfg.optimizer.weight_decay > 0, name
    assert checked == {"pos_embed", "cls_token"} | ({"dist_token"} if built.distilled else set())


def test_weight_decay_convention_is_set_as_detectron2s_knobs():
    """The config names detectron2 ViTDet's convention ('norms': weight_decay_norm=0, biases
    decayed); 'norms_and_biases' adds weight_decay_bias=0; a knob that contradicts the
    convention, or a convention that does not exist, is an error naming it."""
    cfg = tiny(S_T3)
    assert cfg.optimizer.params.weight_decay_convention == "norms" and "weight_decay_norm" not in cfg.optimizer.params
    model = instantiate(cfg.model)
    named = dict(model.named_parameters())
    for convention, bias_decay in (("norms", 0.1), ("norms_and_biases", 0.0)):
        groups = srvit_optimizer_params(model, base_lr=1e-4, weight_decay=0.1, weight_decay_convention=convention)
        wd_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
        assert wd_of[id(named[PREFIX + "units.1.blocks.0.norm1.weight"])] == 0.0
        assert wd_of[id(named[PREFIX + "units.1.router.bias"])] == bias_decay
        assert wd_of[id(named["roi_heads.box_predictor.cls_score.bias"])] == bias_decay
        assert wd_of[id(named[PREFIX + "units.1.router.weight"])] == 0.1
    with pytest.raises(ValueError, match="weight_decay_norm=0.05 contradicts weight_decay_convention='norms'"):
        srvit_optimizer_params(model, base_lr=1e-4, weight_decay_norm=0.05)
    with pytest.raises(ValueError, match=r"weight_decay_convention='vitdet' is not one of \['norms', "):
        srvit_optimizer_params(model, base_lr=1e-4, weight_decay_convention="vitdet")


def synthetic_batch(size=64):
    """Two images with two instances each (boxes, classes and masks), as the mapper yields them."""
    g = torch.Generator().manual_seed(0)
    batch = []
    for classes in ([1, 5], [7, 1]):
        masks = torch.zeros(2, size, size, dtype=torch.bool)
        masks[0, 6:38, 8:40] = True
        masks[1, 30:60, 24:54] = True
        instances = Instances((size, size), gt_boxes=BitMasks(masks).get_bounding_boxes(),
                              gt_classes=torch.tensor(classes), gt_masks=BitMasks(masks))
        batch.append({"image": torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g),
                      "instances": instances, "height": size, "width": size})
    return batch


def test_the_config_sweep_includes_subfolders_but_not_common():
    names = [os.path.relpath(p, CONFIGS) for p in SHIPPED]
    assert os.path.join("quickstart", "mask_rcnn_srvit_tiny_cpu.py") in names and "mask_rcnn_srvit_s_t3.py" in names
    assert not any(n.startswith("common") for n in names)
    # every other config is in the zoo's sweep
    every = glob.glob(os.path.join(CONFIGS, "**", "*.py"), recursive=True)
    assert sorted(SHIPPED + ZOO) == sorted(p for p in every if os.path.relpath(p, CONFIGS).split(os.sep)[0] != "common")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: os.path.relpath(p, CONFIGS))
def test_every_config_trains_one_step(path):
    """Every parameter gets a gradient (DDP with find_unused_parameters=False needs it) and
    the config's optimizer holds every trainable parameter."""
    cfg = validate_config(LazyConfig.apply_overrides(LazyConfig.load(path), tiny_overrides(path)))
    assert_one_step_trains_every_parameter(cfg, path)


def assert_one_step_trains_every_parameter(cfg, path):
    """One training step of ``cfg``'s model and optimizer: the optimizer holds every trainable
    parameter, each stage's losses are there, every parameter gets a gradient, the step updates
    the mask predictor; returns the model."""
    torch.manual_seed(0)
    model = instantiate(cfg.model).train()
    cfg.optimizer.params.model = model
    optim = instantiate(cfg.optimizer)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert {id(p) for g in optim.param_groups for p in g["params"]} == {id(p) for p in trainable.values()}
    with EventStorage():  # the detector logs training statistics
        losses = model(synthetic_batch())
    stages = [f"_stage{i}" for i in range(3)] if is_cascade(path) else [""]  # reference/: ViTDet-B's cascade too
    assert {f"loss_{k}{s}" for k in ("cls", "box_reg") for s in stages} | {"loss_rpn_cls", "loss_mask"} <= set(losses)
    loss = sum(losses.values())
    assert torch.isfinite(loss)
    loss.backward()
    assert [n for n, p in trainable.items() if p.grad is None] == []
    before = trainable["roi_heads.mask_head.predictor.weight"].detach().clone()
    optim.step()
    assert not torch.equal(before, trainable["roi_heads.mask_head.predictor.weight"])
    return model


@pytest.mark.parametrize("out_features,kept", [(["unit2"], 3), (["unit1", "unit3"], 4), (["unit4"], 5),
                                               (["unit1", "last_feat"], 6)])
def test_backbone_holds_and_runs_only_what_it_returns(out_features, kept):
    net = SRViTBackbone("srvit_s_t2", img_size=64, out_features=out_features, embed_dim=32, num_heads=2,
                        drop_path_rate=0.0)
    assert len(net.srvit.units) == kept
    x = torch.randn(2, 3, 64, 64)
    out = net(x)
    assert set(out) == set(out_features)
    sum(o.pow(2).mean() for o in out.values()).backward()
    assert [n for n, p in net.named_parameters() if p.grad is None] == []
    # the same features as the whole core model with these weights
    full = create_srvit("srvit_s_t2", img_size=64, embed_dim=32, num_heads=2, num_classes=0, global_pool="").eval()
    missing = full.load_state_dict(net.srvit.state_dict(), strict=False).missing_keys
    assert all(k.startswith(tuple(f"units.{i}." for i in range(kept, 6)) + ("norm.",)) for k in missing)
    with torch.no_grad():
        ref = full.forward_feature_maps(x, indices=[0, 1, 2, 3, 4, 5])
        got = net.eval()(x)
    for f in out_features:
        torch.testing.assert_close(got[f], ref[f])
    # layer decay counts the whole network, whichever units are kept (as the mmseg adapter)
    for group in srvit_optimizer_params(net, base_lr=1.0, lr_decay=0.7):
        for p in group["params"]:
            name = next(n for n, q in net.named_parameters() if q is p)
            assert group["lr"] == pytest.approx(lr_decay_factor(name, 0.7, [1, 4, 3, 2, 1, 1], "srvit.")), name


def test_backbone_outputs_and_shapes():
    net = SRViTBackbone("srvit_s_t2", img_size=256, out_features=["last_feat", "unit1", "unit4"], embed_dim=64,
                        num_heads=2)
    out = net(torch.randn(1, 3, 256, 192))
    assert set(out) == {"last_feat", "unit1", "unit4"}
    for f, spec in net.output_shape().items():
        assert spec.stride == 16 and spec.channels == 64 and out[f].shape == (1, 64, 16, 12)
    with pytest.raises(ValueError, match="unknown.*unit9"):
        SRViTBackbone("srvit_s_t2", img_size=64, out_features=["unit9"])
    with pytest.raises(ValueError, match="unknown SR-ViT variant"):
        SRViTBackbone("srvit_x_t2")


def test_yacs_registry_builds_the_detector():
    cfg = get_cfg()
    add_srvit_config(cfg)
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.NAME = "build_srvit_sfp_backbone"
    cfg.MODEL.SRVIT.VARIANT = "srvit_t_t2"
    cfg.MODEL.SRVIT.IMG_SIZE = 128
    cfg.MODEL.SRVIT.SFP.SQUARE_PAD = 128
    cfg.MODEL.MASK_ON = True
    cfg.MODEL.RPN.IN_FEATURES = cfg.MODEL.ROI_HEADS.IN_FEATURES = ["p2", "p3", "p4", "p5"]
    cfg.MODEL.RPN.IN_FEATURES = ["p2", "p3", "p4", "p5", "p6"]
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[32], [64], [128], [256], [512]]
    cfg.MODEL.ROI_HEADS.NAME = "StandardROIHeads"
    cfg.MODEL.ROI_BOX_HEAD.NAME = "FastRCNNConvFCHead"
    cfg.MODEL.ROI_BOX_HEAD.NUM_FC = 2
    cfg.MODEL.ROI_MASK_HEAD.NAME = "MaskRCNNConvUpsampleHead"
    # MODEL.SRVIT keys away from their defaults, each to be found in the built backbone
    cfg.MODEL.SRVIT.DROP_PATH_RATE = 0.2
    cfg.MODEL.SRVIT.WINDOW_SIZE = 4
    cfg.MODEL.SRVIT.USE_REL_POS = True
    cfg.MODEL.SRVIT.SFP.OUT_CHANNELS = 64
    cfg.MODEL.RPN.PRE_NMS_TOPK_TEST, cfg.MODEL.RPN.POST_NMS_TOPK_TEST = 100, 20  # a small image: few proposals
    cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST = 0.0  # an untrained detector's scores: keep its 5 best detections
    cfg.TEST.DETECTIONS_PER_IMAGE = 5
    model = build_model(cfg).eval()
    net = model.backbone.net
    assert isinstance(net, SRViTBackbone)
    assert (net.srvit.layout, net.srvit.num_steps, net.srvit.embed_dim) == ((3, 2, 1), 2, 384)  # srvit_t_t2
    assert net.srvit.pretrain_grid == (8, 8)  # IMG_SIZE 128
    assert net.srvit.schedule.applications[-1].drop_path_rate == pytest.approx(0.2)
    windows = {a.window_size for a in net.srvit.schedule.applications}
    assert windows == {0, 4} and net.srvit.global_attn_indexes == net.srvit.schedule.default_global_indexes
    assert all(isinstance(b.attn, RelPosAttention) for u in net.srvit.units for b in u.blocks)
    assert model.backbone.output_shape() == {f"p{i}": ShapeSpec(channels=64, stride=2 ** i) for i in range(2, 7)}
    assert model.backbone.padding_constraints["square_size"] == 128
    with torch.no_grad():
        out = model([{"image": torch.randint(0, 255, (3, 100, 120), dtype=torch.uint8)}])
    instances = out[0]["instances"]
    assert instances.image_size == (100, 120) and len(instances) == 5
    assert {"pred_boxes", "scores", "pred_classes", "pred_masks"} <= set(instances.get_fields())
    from srvit_backbones.detectron2.yacs_config import build_srvit_sfp_backbone

    cfg.MODEL.SRVIT.COMPILE = True  # built, not run: inductor compiles for minutes on this CPU
    assert build_srvit_sfp_backbone(cfg, ShapeSpec(channels=3)).net.compile_options == {}
    assert instances.pred_masks.shape == (5, 100, 120)
    boxes = instances.pred_boxes.tensor
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 120).all() and (boxes[:, 3] <= 100).all()


def _save_core(tmp_path, variant, name, **kw):
    core = create_srvit(variant, **kw)
    path = str(tmp_path / name)
    torch.save({"model": core.state_dict(), "epoch": 3}, path)
    return core, path


def test_pretraining_checkpoint_loads_into_the_detector(tmp_path, caplog):
    core, path = _save_core(tmp_path, "srvit_t_t2", "pre.pth", embed_dim=64, num_heads=2)  # 224, 14x14
    cfg = LazyConfig.load(QUICKSTART)
    model = instantiate(cfg.model).eval()
    SRViTCheckpointer(model).load(path)
    backbone = model.backbone.net.srvit
    assert backbone.pos_embed.shape == (1, 12 * 12 + 1, 64)
    # the expected table, interpolated here (14x14 -> 12x12), not by the loader's own function
    resized = interpolated_pos_embed(core.pos_embed.detach(), (14, 14), (12, 12))
    torch.testing.assert_close(backbone.pos_embed.detach(), resized)
    # same weights landed: the backbone's features equal the core model's on the same input
    core.eval()
    x = torch.randn(1, 3, 192, 192)
    with torch.no_grad():
        torch.testing.assert_close(model.backbone.net(x)["last_feat"],
                                   _core_with_table(core, resized).forward_feature_maps(x)["last_feat"])


def _core_with_table(core, table):
    """The core model at the detector's 192 pixels with the position table ``table``."""
    ref = create_srvit("srvit_t_t2", embed_dim=64, num_heads=2, img_size=192, num_classes=core.num_classes).eval()
    sd = core.state_dict()
    sd["pos_embed"] = table
    ref.load_state_dict(sd)
    return ref


def test_checkpoint_of_another_width_or_t_is_a_clear_error(tmp_path):
    cfg = LazyConfig.load(QUICKSTART)  # srvit_t_t2 with width 64
    model = instantiate(cfg.model)
    _, wide = _save_core(tmp_path, "srvit_t_t2", "wide.pth", embed_dim=128, num_heads=2)
    with pytest.raises(CheckpointError, match="width is 128, the model's 64"):
        SRViTCheckpointer(model).load(wide)
    _, deeper = _save_core(tmp_path, "srvit_t_t3", "t3.pth", embed_dim=64, num_heads=2)
    with pytest.raises(CheckpointError, match=r"recursion depth is T=\[3\], the model's T=2"):
        SRViTCheckpointer(model).load(deeper)


# ----------------------------------------------------------------------------- end to end
def train_net_args(argv):
    """``argv`` parsed as tools/train_net.py parses its command line."""
    return load_tool("train_net").parse_args(argv)


def run_train_net(tmp_path, *args, config=QUICKSTART, num_gpus=1, timeout=600):
    env = dict(os.environ, DETECTRON2_DATASETS=str(tmp_path / "data"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config", config,
           "--num-gpus", str(num_gpus), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path))
    return proc, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("d2")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_synthetic_coco.py"), "--root",
                    str(root / "data"), "--train", "16", "--val", "4", "--size", "128", "160"], check=True)
    return root


def in_process_data(coco_root):
    """Overrides that read the synthetic COCO in this process, under names of its own
    (detectron2's builtin coco_2017_* paths were fixed when detectron2.data was imported)."""
    from detectron2.data import DatasetCatalog
    from detectron2.data.datasets import register_coco_instances

    names = {}
    for split in ("train", "val"):
        names[split] = f"srvit_synthetic_coco_{split}_{abs(hash(str(coco_root)))}"
        if names[split] not in DatasetCatalog.list():
            coco = coco_root / "data" / "coco"
            register_coco_instances(names[split], {}, str(coco / "annotations" / f"instances_{split}2017.json"),
                                    str(coco / f"{split}2017"))
    return [f"dataloader.train.dataset.names={names['train']}", f"dataloader.test.dataset.names={names['val']}"]


COMMON = ["model.backbone.net.img_size=128", "model.backbone.square_pad=128",
          "dataloader.train.mapper.augmentations.1.target_height=128",
          "dataloader.train.mapper.augmentations.1.target_width=128",
          "dataloader.train.mapper.augmentations.2.crop_size=[128,128]",
          "dataloader.test.mapper.augmentations.0.short_edge_length=128",
          "dataloader.test.mapper.augmentations.0.max_size=128",
          "dataloader.train.total_batch_size=2", "train.log_period=2"]
MID = 12  # the first run also saves model_0000012.pth: a checkpoint in the middle of its schedule


@pytest.fixture(scope="module")
def trained(coco_root):
    """A real tools/train_net.py run of 16 iterations: its output folder."""
    out = str(coco_root / "out")
    proc, log = run_train_net(coco_root, f"train.output_dir={out}", *COMMON, "train.max_iter=16",
                              "train.eval_period=16", f"train.checkpointer.period={MID + 1}")
    assert proc.returncode == 0, log[-3000:]
    assert "copypaste: Task: bbox" in log and "copypaste: Task: segm" in log
    return out


def test_train_eval_resume_end_to_end(coco_root, trained):
    metrics = [json.loads(line) for line in open(os.path.join(trained, "metrics.json"))]
    losses = [m["total_loss"] for m in metrics if "total_loss" in m]
    assert len(losses) >= 6 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-2:]) < sum(losses[:2]), losses
    assert os.path.exists(os.path.join(trained, "model_final.pth"))

    out = str(coco_root / "continued")
    shutil.copytree(trained, out)
    proc, log = run_train_net(coco_root, "--resume", f"train.output_dir={out}", *COMMON, "train.max_iter=18",
                              "train.eval_period=1000")
    assert proc.returncode == 0, log[-3000:]
    assert "Starting training from iteration 16" in log

    proc, log = run_train_net(coco_root, "--eval-only", f"train.output_dir={out}", *COMMON,
                              f"train.init_checkpoint={os.path.join(trained, 'model_final.pth')}")
    assert proc.returncode == 0, log[-3000:]
    assert "copypaste: Task: bbox" in log and "copypaste: Task: segm" in log


def assert_same_tensors(actual, expected):
    assert set(actual) == set(expected)
    for k, v in expected.items():
        assert torch.equal(actual[k], v), k


def test_resume_restores_the_checkpointed_state(coco_root, trained, tmp_path):
    """--resume from the middle of a schedule, through train_net's own trainer construction:
    weights, AdamW moments, iteration and lr are the checkpoint's, and the lr schedule goes on
    exactly as in the uninterrupted run."""
    name = f"model_{MID:07d}.pth"
    shutil.copy(os.path.join(trained, name), tmp_path)
    (tmp_path / "last_checkpoint").write_text(name)
    ckpt = torch.load(tmp_path / name, map_location="cpu", weights_only=True)
    args = train_net_args(["--config", QUICKSTART, "--resume", f"train.output_dir={tmp_path}", *COMMON,
                           "train.max_iter=16", "train.eval_period=1000", "train.checkpointer.period=1000",
                           *in_process_data(coco_root)])
    cfg = train_net.load_config(args)
    trainer, start_iter = train_net.build_trainer(args, cfg)

    assert trainer.iter == ckpt["iteration"] == MID and start_iter == MID + 1
    assert_same_tensors(trainer.model.state_dict(), ckpt["model"])
    optim, saved = trainer.optimizer, ckpt["trainer"]["optimizer"]
    assert [g["lr"] for g in optim.param_groups] == [g["lr"] for g in saved["param_groups"]]
    router = trainer.model.backbone.net.srvit.units[1].router.weight
    index = next(i for i, p in enumerate(p for g in optim.param_groups for p in g["params"]) if p is router)
    assert saved["state"][index]["exp_avg_sq"].abs().sum() > 0  # a trained moment, not a fresh zero
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(optim.state[router][key], saved["state"][index][key]), key

    best = hooks.LRScheduler.get_best_param_group_id(optim)
    trainer.train(start_iter, cfg.train.max_iter)
    lr_at = {it: lr for lr, it in trainer.storage.history("lr").values()}
    assert lr_at[MID + 1] == saved["param_groups"][best]["lr"]
    uninterrupted = {m["iteration"]: m["lr"] for m in map(json.loads, open(os.path.join(trained, "metrics.json")))
                     if "lr" in m}
    shared = sorted(set(lr_at) & set(uninterrupted))
    assert shared and [lr_at[i] for i in shared] == pytest.approx([uninterrupted[i] for i in shared], rel=1e-12)


def test_a_diverged_run_stops_at_once_naming_the_last_checkpoint(coco_root, tmp_path):
    """A real divergence (lr 1e6, a checkpoint every iteration): detectron2's own check stops the
    run, re-raised naming the iteration, the last checkpoint (complete, finite) and the fixes; the
    diverged iteration is not saved."""
    args = train_net_args(["--config", QUICKSTART, f"train.output_dir={tmp_path}", *COMMON, "train.max_iter=8",
                           "train.eval_period=1000", "train.checkpointer.period=1", "optimizer.lr=1e6",
                           *in_process_data(coco_root)])
    with pytest.raises(FloatingPointError, match="diverged") as error:
        train_net.do_train(args, train_net.load_config(args))
    iteration, last = divergence_report(str(error.value))
    assert 1 <= iteration <= 3 and last == os.path.join(str(tmp_path), f"model_{iteration - 1:07d}.pth")
    assert "optimizer.lr" in str(error.value) and not os.path.exists(tmp_path / f"model_{iteration:07d}.pth")
    assert all(torch.isfinite(v).all() for v in torch.load(last, weights_only=True)["model"].values())


# fewer regions through the heads' convolutions, whose fp16 backward is the CPU's slow path
FEW_ROIS = ["model.roi_heads.batch_size_per_image=8", "dataloader.train.total_batch_size=1"]


class CPUAMPTrainer(AMPTrainer):
    """A CPU stand-in for detectron2's ``AMPTrainer`` (a test fixture, not a feature): its
    ``run_step``, unmodified, under CPU autocast to its precision, with ``torch.cuda.is_available``
    answering yes for the step (its assertion; its CUDA autocast is then a no-op on CPU tensors),
    and a CPU GradScaler (its default, CUDA's, is off without CUDA)."""

    def __init__(self, model, data_loader, optimizer, **kwargs):
        super().__init__(model, data_loader, optimizer, grad_scaler=torch.amp.GradScaler("cpu"), **kwargs)

    def run_step(self):
        with torch.autocast("cpu", dtype=self.precision), mock.patch("torch.cuda.is_available", return_value=True):
            super().run_step()


def test_an_fp16_grad_scaler_skipping_every_step_stops_the_run(coco_root, tmp_path, monkeypatch):
    """tools/train_net.py's trainer in fp16 (``CPUAMPTrainer`` standing in for detectron2's
    AMPTrainer, which ``trainer_class`` builds on CUDA) with its hooks, on a GradScaler whose
    scale, restored from its state as a resume restores it, overflows fp16's gradients at every
    halving (1e30): every step is skipped, silently to detectron2, and the DivergenceCheck stops
    the run at the first skip past its limit (1 here: the CPU's fp16 steps take seconds; the
    default 20 is counted in test_pretrain and test_faults)."""
    from srvit_backbones.detectron2 import faults as detectron2_faults
    from srvit_backbones.detectron2 import training

    monkeypatch.setattr(training, "trainer_class", lambda cfg: (CPUAMPTrainer, dict(precision=torch.float16)))
    args = train_net_args(["--config", QUICKSTART, f"train.output_dir={tmp_path}", *TINY, *FEW_ROIS,
                           "train.max_iter=8", "train.eval_period=1000", "train.checkpointer.period=1000",
                           *in_process_data(coco_root)])
    trainer, start_iter = train_net.build_trainer(args, train_net.load_config(args))
    assert type(trainer) is CPUAMPTrainer
    scaler = trainer.grad_scaler
    scaler.load_state_dict({**scaler.state_dict(), "scale": 1e30})  # as trainer.load_state_dict on --resume
    (check,) = [hook for hook in trainer._hooks if isinstance(hook, detectron2_faults.DivergenceCheck)]
    check.skipped.limit = 1
    logits = []
    trainer.model.roi_heads.box_predictor.cls_score.register_forward_hook(
        lambda module, inputs, output: logits.append(output.dtype))
    with pytest.raises(FloatingPointError) as error, detectron2_faults.explained_divergence(trainer):
        trainer.train(start_iter, 8)  # do_train's
    iteration, last = divergence_report(str(error.value))
    assert iteration == trainer.iter == 1 and len(logits) == 2 and last is None  # 0-based: the second step
    assert set(logits) == {torch.float16}
    assert "AMPTrainer's GradScaler skipped 2 optimizer steps in a row" in str(error.value)
    assert trainer.grad_scaler.get_scale() == pytest.approx(1e30 / 2 ** 2)


def test_amp_is_detectron2s_amp_trainer_on_cuda_and_refused_on_the_cpu(tmp_path):
    """``train.amp.enabled=True`` builds detectron2's own AMPTrainer (its default GradScaler) where
    ``train.device`` is CUDA, in fp16 or ``train.amp.precision``'s dtype, and SimpleTrainer
    without it (``trainer_class``: this machine cannot build AMPTrainer's CUDA GradScaler); on a
    CPU tools/train_net.py refuses it before anything is built, naming the fix (a
    ``train.amp.precision`` that names no dtype: ``test_train_net_bad_input_is_explained``)."""
    from srvit_backbones.detectron2.training import load_config, trainer_class

    cfg = load_config(S_T3, ["train.device=cuda:1"])
    assert cfg.train.amp.enabled and trainer_class(cfg) == (AMPTrainer, dict(precision=torch.float16))
    cfg.train.amp.precision = "bf16"
    assert trainer_class(cfg) == (AMPTrainer, dict(precision=torch.bfloat16))
    cfg.train.amp.enabled = False
    assert trainer_class(cfg) == (SimpleTrainer, {})
    tool = load_tool("train_net")  # its parser and main, as launch runs them
    argv = ["--config", QUICKSTART, f"train.output_dir={tmp_path}", *TINY, "train.amp.enabled=True"]
    with pytest.raises(SystemExit, match=r"^config error: train.amp.enabled=True trains in mixed precision with "
                                         r"detectron2's AMPTrainer, which needs a CUDA GPU, and train.device is "
                                         r"'cpu': pass train.amp.enabled=False to train in fp32$"):
        tool.main(tool.parse_args(argv))


def test_a_checkpoint_write_cut_short_keeps_the_last_complete_one(coco_root, trained, tmp_path):
    """A full disk while model_final.pth is rewritten at the end of a resumed run (ulimit -f): an
    error naming the file and the cause; the earlier model_final.pth (fvcore would have truncated
    it) stays complete and named by last_checkpoint, and --resume restores it by value."""
    final = tmp_path / "model_final.pth"
    shutil.copy(os.path.join(trained, "model_final.pth"), final)
    (tmp_path / "last_checkpoint").write_text("model_final.pth")
    saved = final.read_bytes()
    args = train_net_args(["--config", QUICKSTART, "--resume", f"train.output_dir={tmp_path}", *COMMON,
                           "train.max_iter=17", "train.eval_period=1000", "train.checkpointer.period=1000",
                           *in_process_data(coco_root)])
    trainer, start_iter = train_net.build_trainer(args, train_net.load_config(args))
    with file_size_limit(len(saved) // 2), pytest.raises(OSError, match=rf"'{re.escape(str(final))}' was not "
                                                                        r"written: File too large"):
        trainer.train(start_iter, 17)
    assert final.read_bytes() == saved and (tmp_path / "last_checkpoint").read_text() == "model_final.pth"
    assert not list(tmp_path.glob("*.tmp"))

    trainer, start_iter = train_net.build_trainer(args, train_net.load_config(args))
    ckpt = torch.load(final, map_location="cpu", weights_only=True)
    assert start_iter == ckpt["iteration"] + 1 == 16
    assert_same_tensors(trainer.model.state_dict(), ckpt["model"])
    assert trainer.optimizer.state_dict()["state"].keys() == ckpt["trainer"]["optimizer"]["state"].keys()
    for got, expected in zip(trainer.optimizer.state_dict()["state"].values(),
                             ckpt["trainer"]["optimizer"]["state"].values()):
        assert all(torch.equal(got[k], expected[k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def test_eval_only_loads_model_final(trained):
    final = os.path.join(trained, "model_final.pth")
    args = train_net_args(["--config", QUICKSTART, "--eval-only", f"train.output_dir={trained}", *COMMON,
                           f"train.init_checkpoint={final}"])
    model = train_net.build_eval_model(train_net.load_config(args))
    assert_same_tensors(model.state_dict(), torch.load(final, map_location="cpu", weights_only=True)["model"])


def test_model_final_loads_into_the_core_model(trained):
    """A detector's checkpoint gives its backbone to any other user of the core (mmseg...)."""
    final = os.path.join(trained, "model_final.pth")
    saved = torch.load(final, map_location="cpu", weights_only=True)["model"]
    core = create_srvit("srvit_t_t2", img_size=128, embed_dim=64, num_heads=2, num_classes=0, global_pool="")
    core.prune_intermediate_layers([len(core.units) - 1], prune_norm=True)  # as the detector's backbone
    load_pretrained(core, final)
    backbone = {k[len(PREFIX):]: v for k, v in saved.items() if k.startswith(PREFIX)}
    assert_same_tensors(core.state_dict(), backbone)


def test_partial_pretraining_checkpoint_needs_opt_in(coco_root, tmp_path):
    core = create_srvit("srvit_t_t2", img_size=192, embed_dim=64, num_heads=2)  # the quickstart backbone
    partial = {k: v for k, v in core.state_dict().items() if not k.startswith("units.2.")}
    path = str(tmp_path / "partial.pth")
    torch.save({"model": partial, "epoch": 1}, path)
    argv = ["--config", QUICKSTART, f"train.output_dir={tmp_path}", f"train.init_checkpoint={path}",
            *in_process_data(coco_root)]
    args = train_net_args(argv)
    with pytest.raises(CheckpointError, match="units.2"):
        train_net.build_trainer(args, train_net.load_config(args))

    args = train_net_args(argv + ["model.backbone.net.allow_partial=True"])
    trainer, _ = train_net.build_trainer(args, train_net.load_config(args))
    loaded = trainer.model.backbone.net.srvit.state_dict()
    for k, v in partial.items():
        if not k.startswith(("head.", "norm.")):  # the detector's backbone has neither
            assert torch.equal(loaded[k], v), k


# your own data: a 3-class COCO-format set (the generator's --categories layout) at 96 pixels
CUSTOM_CLASSES = ["disc", "box", "wedge"]
CUSTOM_SIZE = ["model.backbone.net.img_size=96", "model.backbone.square_pad=128",
               "dataloader.train.mapper.augmentations.1.target_height=96",
               "dataloader.train.mapper.augmentations.1.target_width=96",
               "dataloader.train.mapper.augmentations.2.crop_size=[96,96]",
               "dataloader.test.mapper.augmentations.0.short_edge_length=96",
               "dataloader.test.mapper.augmentations.0.max_size=128", "dataloader.train.total_batch_size=2",
               "dataloader.train.num_workers=0", "dataloader.test.num_workers=0"]


@pytest.fixture(scope="module")
def custom_coco(tmp_path_factory):
    """The documented data options for a custom set: --coco-train JSON IMAGES --coco-val JSON IMAGES."""
    root = tmp_path_factory.mktemp("custom")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_synthetic_coco.py"), "--root", str(root),
                    "--train", "16", "--val", "4", "--size", "96", "128", "--categories", *CUSTOM_CLASSES], check=True)
    return ["--coco-train", str(root / "annotations" / "train.json"), str(root / "train"),
            "--coco-val", str(root / "annotations" / "val.json"), str(root / "val")]


def test_fine_tune_a_coco_detector_on_three_classes_of_your_own(coco_root, trained, custom_coco, tmp_path):
    """tools/train_net.py --coco-train/--coco-val from the 80-class quickstart detector: the head
    is sized from the file's 3 categories, the class-dependent layers start anew (listed in the
    log), the evaluator reports the file's classes, and 40 iterations learn: box AP50 above 2
    (measured at this seed: box AP50 12.2, mask AP50 11.6; seeds 1 and 2, from a 2-iteration base
    on other images: 3.9 and 8.6; the head untrained after 6 iterations from scratch: 0.1)."""
    out = tmp_path / "out"
    proc, log = run_train_net(coco_root, *custom_coco, f"train.output_dir={out}", *CUSTOM_SIZE,
                              f"train.init_checkpoint={os.path.join(trained, 'model_final.pth')}",
                              "train.max_iter=40", "train.eval_period=40", "train.log_period=5", "optimizer.lr=1e-3",
                              "lr_multiplier.warmup_length=0.1", "train.checkpointer.period=1000")
    assert proc.returncode == 0, log[-3000:]
    assert "data check: 22 files" in log and "no errors" in log
    assert re.search(r"6 class-dependent tensors start from their initialisation.*"
                     r"roi_heads.box_predictor.cls_score.weight \(81, 256\) -> \(4, 256\)", log), log[-3000:]
    assert all(re.search(rf"\|\s+{name}\s+\|", log) for name in CUSTOM_CLASSES)  # the per-class AP table
    box_ap50 = float(re.findall(r"copypaste: ([\d.nan]+),([\d.nan]+),", log)[0][1])
    assert box_ap50 > 2.0, log[-2000:]


def test_fine_tuning_loads_all_but_the_class_layers_and_refuses_foreign_files(coco_root, trained, custom_coco,
                                                                              tmp_path):
    """In train_net's own trainer: every tensor of the 80-class detector but the class-dependent
    ones lands in the 3-class one (the backbone's position table resized to 96 pixels); a class
    mismatch elsewhere, and a file without the SR-ViT backbone (a ResNet state dict, as .pth, as a
    detectron2 checkpoint or as a model-zoo .pkl) are CheckpointErrors naming them, unless
    allow_partial."""
    final = os.path.join(trained, "model_final.pth")
    saved = torch.load(final, map_location="cpu", weights_only=True)["model"]

    def trainer(*opts):
        args = train_net_args(["--config", QUICKSTART, *custom_coco, f"train.output_dir={tmp_path}",
                               *CUSTOM_SIZE, *opts])
        return train_net.build_trainer(args, train_net.load_config(args))[0]

    model = trainer(f"train.init_checkpoint={final}").model.state_dict()
    class_layers = {k for k in saved if re.match(r"roi_heads\.(box_predictor\.(cls_score|bbox_pred)|mask_head\."
                                                 r"predictor)\.", k)}
    assert len(class_layers) == 6 and all(model[k].shape[0] in (3, 4, 12) for k in class_layers)
    resized = {PREFIX + "pos_embed"}
    assert [k for k in saved.keys() - class_layers - resized if not torch.equal(model[k], saved[k])] == []
    assert model[PREFIX + "pos_embed"].shape[1] == 1 + 6 * 6

    wider = dict(saved, **{"roi_heads.box_head.fc1.weight": torch.zeros(300, 1024)})
    torch.save({"model": wider}, tmp_path / "wider.pth")
    with pytest.raises(CheckpointError, match=r"roi_heads.box_head.fc1.weight: checkpoint \(300, 1024\)"):
        trainer(f"train.init_checkpoint={tmp_path / 'wider.pth'}")

    resnet = {"conv1.weight": torch.zeros(64, 3, 7, 7), "layer1.0.conv1.weight": torch.zeros(64, 64, 3, 3),
              "fc.weight": torch.zeros(1000, 512)}
    torch.save(resnet, tmp_path / "resnet.pth")
    torch.save({"model": {f"backbone.bottom_up.{k}": v for k, v in resnet.items()}}, tmp_path / "r_cnn.pth")
    with open(tmp_path / "r50_model_zoo.pkl", "wb") as f:  # detectron2's model-zoo format: Caffe2 names, numpy arrays
        pickle.dump({"model": {"conv1_w": np.zeros((64, 3, 7, 7), np.float32),
                               "res2_0_branch2a_w": np.zeros((64, 64, 1, 1), np.float32)},
                     "__author__": "Detectron"}, f)
    for name in ("resnet.pth", "r_cnn.pth", "r50_model_zoo.pkl"):
        with pytest.raises(CheckpointError, match=r"train.init_checkpoint does not hold 112 of the SR-ViT backbone's "
                                                  r"tensors(.|\n)*"
                                                  r"backbone.net.srvit.units.\{0,1,2,3,4\}.blocks.\* \(96\)"
                                                  r"(.|\n)*allow_partial=True"):
            trainer(f"train.init_checkpoint={tmp_path / name}")
    trainer(f"train.init_checkpoint={tmp_path / 'resnet.pth'}", "model.backbone.net.allow_partial=True")


def test_prefer_ema_is_a_backbone_setting(tmp_path):
    kw = dict(img_size=192, embed_dim=64, num_heads=2)  # the quickstart backbone
    weights, ema = create_srvit("srvit_t_t2", **kw), create_srvit("srvit_t_t2", **kw)
    path = str(tmp_path / "pre.pth")
    torch.save({"model": weights.state_dict(), "model_ema": ema.state_dict()}, path)
    for prefer_ema, source in ((False, weights), (True, ema)):
        cfg = LazyConfig.apply_overrides(LazyConfig.load(QUICKSTART), [f"model.backbone.net.prefer_ema={prefer_ema}"])
        model = instantiate(cfg.model)
        SRViTCheckpointer(model).load(path)
        loaded = model.backbone.net.srvit.state_dict()
        for k, v in source.state_dict().items():
            if not k.startswith(("head.", "norm.")):
                assert torch.equal(loaded[k], v), (prefer_ema, k)


def test_two_process_ddp_on_cpu(lvis_root):
    """Two iterations, so that a parameter without a gradient would fail the second one
    (detectron2's default DDP settings: find_unused_parameters=False). The S-T3 backbone runs
    inside the LVIS Cascade Mask R-CNN: the cascade's three stages, the federated loss and the
    repeat-factor sampler under DDP too (builtin lvis_v1_* names on synthetic LVIS). The tiny
    Mask R-CNN's DDP run (act checkpointing on) is test_two_machines_..., below."""
    config = os.path.join(CONFIGS, "lvis/cascade_mask_rcnn_srvit_s_t3.py")
    assert LazyConfig.load(config).train.ddp.find_unused_parameters is False
    out = str(lvis_root / f"ddp_{os.path.basename(config)}")
    proc, log = run_train_net(lvis_root, *tiny_overrides(config), f"train.output_dir={out}", "train.max_iter=2",
                              "train.eval_period=1000", "dataloader.train.total_batch_size=2", "train.log_period=1",
                              config=config, num_gpus=2)
    assert proc.returncode == 0, log[-3000:]
    assert "iter: 1" in log


def test_two_machines_train_as_one_and_a_killed_rank_ends_the_job(coco_root, tmp_path):
    """tools/train_net.py as 2 machines x 1 process on 127.0.0.1 (--num-machines 2 --machine-rank R
    --dist-url) and as 1 machine x 2 processes (--num-gpus 2), side by side, DDP with detectron2's
    defaults (find_unused_parameters=False) and act checkpointing: the checkpoint after 2 steps
    is the same, bit for bit. Then machine 1's worker is SIGKILLed: both machines exit non-zero
    within 120 s, no worker is left, machine 1 names rank 1 and the signal, and the checkpoint is
    as it was written. (The 1 x 2 run is stopped at that checkpoint.)"""
    config = LazyConfig.load(QUICKSTART)
    assert config.train.ddp.find_unused_parameters is False
    env = dict(os.environ, DETECTRON2_DATASETS=str(coco_root / "data"), OMP_NUM_THREADS="1")

    def launch(layout, log, *processes):
        return subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config", QUICKSTART,
                                 *processes, *TINY, "model.backbone.net.use_act_checkpoint=True", "train.max_iter=20",
                                 "train.eval_period=1000", "dataloader.train.total_batch_size=2",
                                 "train.checkpointer.period=2", f"train.output_dir={tmp_path / layout}"], env=env,
                                cwd=str(coco_root), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    def spawned(pid):  # a machine's workers: detectron2's launch spawns them (multiprocessing's resource tracker aside)
        return [child for child in child_pids(pid) if b"spawn_main" in open(f"/proc/{child}/cmdline", "rb").read()]

    port, logs = free_port(), [tmp_path / f"machine{r}.log" for r in (0, 1)]
    machines = [launch("2x1", log, "--num-gpus", "1", "--num-machines", "2", "--machine-rank", str(rank),
                       "--dist-url", f"tcp://127.0.0.1:{port}") for rank, log in enumerate(logs)]
    second_step = "model_0000001.pth"  # iterations 0 and 1
    saved = kill_machine_1_beside_one_machine(  # "" in a file: it exists (checkpoints are renamed in place whole)
        machines, launch("1x2", tmp_path / "1x2.log", "--num-gpus", "2"), (tmp_path / "2x1" / second_step, ""),
        (tmp_path / "1x2" / second_step, ""), tmp_path / "2x1" / second_step, workers=spawned)
    assert re.search(r"rank 1 \(process \d+ on machine 1\) was killed by signal SIGKILL", logs[1].read_text())
    assert (tmp_path / "2x1" / second_step).read_bytes() == saved
    two, one = (torch.load(tmp_path / layout / second_step, weights_only=True) for layout in ("2x1", "1x2"))
    assert two["iteration"] == one["iteration"] == 1
    assert_same_tensors(two["model"], one["model"])


@pytest.mark.parametrize("override,error,match", [
    ("train.init_checkpoint=missing.pth", CheckpointError, "^train.init_checkpoint='missing.pth' does not exist"),
    ("model.backbone.net.variant=srvit_q_t2", ValueError, "unknown SR-ViT variant 'srvit_q_t2'"),
    ("model.backbone.square_pad=200", ConfigError,
     "^config error: model.backbone.square_pad=200 is not a multiple of the patch size 16"),
    ("model.backbone.square_pad=128", ConfigError,
     "^config error: dataloader.train produces images of up to 192 pixels, larger than model.backbone.square_pad=128"),
    ("train.amp.precision=half", ConfigError,
     r"^config error: train.amp.precision='half' is not one of \('fp16', 'bf16'\)"),
    ("model.backbone.net.compile=yes", ValueError, r"compile='yes': give False \(eager\), True"),
    ("model.backbone.net.compile={mood:fast}", ValueError, r"compile=\{'mood': 'fast'\}: .*'mood'.*torch.compile's"),
])
def test_train_net_bad_input_is_explained(tmp_path, override, error, match):
    args = train_net_args(["--config", QUICKSTART, f"train.output_dir={tmp_path}", override])
    with pytest.raises(error, match=match):
        train_net.main(args)  # what each launched process runs


# ----------------------------------------------------------------------------- ViTDet window attention (_win)
WIN = {"mask_rcnn_deit_s_win.py": "mask_rcnn_deit_s.py", **{f"mask_rcnn_srvit_{v}_win.py": f"mask_rcnn_srvit_{v}.py"
                                                            for v in ("s_t2", "s_t3", "s_t4", "b_t2", "b_t3")}}


def test_win_configs_are_the_global_ones_with_vitdet_attention():
    """Each _win config is its global config (recipe, variant, checkpoint) with ViTDet's 14x14
    windows and relative positions, and nothing else changed."""
    assert {os.path.basename(p) for p in glob.glob(os.path.join(CONFIGS, "*_win.py"))} == set(WIN)
    for win_name, global_name in WIN.items():
        win, ref = load(win_name), load(global_name)
        net = win.model.backbone.net
        assert (net.window_size, net.use_rel_pos, net.global_attn_indexes) == (14, True, None), win_name
        for key in ("window_size", "use_rel_pos", "global_attn_indexes"):
            del net[key]
        assert OmegaConf.to_container(win) == OmegaConf.to_container(ref), win_name


@pytest.mark.parametrize("name,global_applications", [
    ("mask_rcnn_srvit_s_t3_win.py", (1, 13, 22, 28, 31)),
    ("mask_rcnn_deit_s_win.py", (2, 5, 8, 11)),  # ViTDet's global blocks
])
def test_win_detector_is_windowed_and_loads_a_class_token_checkpoint(tmp_path, caplog, name, global_applications):
    """The full-size backbone: 14x14 windows in every application but the global ones, table
    pairs of 2*14-1 (windows) and 2*64-1 rows (the 64x64 grid at 1024), no class token; an
    ImageNet checkpoint with a class token (tools/pretrain.py's, or timm's DeiT-S state dict
    for the baseline) loads through SRViTCheckpointer: every tensor by value, the class token
    and its position entry dropped, the new tables zero."""
    cfg = load(name)
    model = instantiate(cfg.model)
    net = model.backbone.net.srvit
    windows = [w for unit in net.units for w in unit.window_sizes]
    assert len(windows) == net.effective_depth
    assert tuple(i for i, w in enumerate(windows) if w == 0) == global_applications
    assert set(windows) == {0, 14}
    assert net.cls_token is None and net.pos_embed.shape == (1, 64 * 64, net.embed_dim)
    tables = {n: p for n, p in net.named_parameters() if is_rel_pos(n)}
    head_dim = net.units[0].blocks[0].attn.head_dim
    for unit in net.units:
        for j, block in enumerate(unit.blocks):
            own = unit.window_sizes[j::len(unit.blocks)]
            assert hasattr(block.attn, "window_rel_pos_h") == any(own)
            assert hasattr(block.attn, "global_rel_pos_h") == (0 in own)
    assert {p.shape for n, p in tables.items() if ".window_" in n} == {(27, head_dim)}
    assert {p.shape for n, p in tables.items() if ".global_" in n} == {(127, head_dim)}

    if name.startswith("mask_rcnn_deit"):  # the baseline's checkpoint: timm's DeiT-S state dict
        import timm

        source = timm.create_model("deit_small_patch16_224").state_dict()
        ckpt, expected = source, {re.sub(r"^blocks\.(\d+)\.", r"units.\1.blocks.0.", k): v for k, v in source.items()}
    else:  # tools/pretrain.py's
        expected = create_srvit(cfg.model.backbone.net.variant).state_dict()
        ckpt = {"model": expected, "epoch": 299}
    path = str(tmp_path / "imagenet.pth")
    torch.save(ckpt, path)
    with caplog.at_level("INFO"):
        SRViTCheckpointer(model).load(path)
    loaded = net.state_dict()
    assert "cls_token" in expected and "cls_token" not in loaded
    for k, v in loaded.items():
        if is_rel_pos(k):
            assert v.abs().sum() == 0, k
        elif k == "pos_embed":
            grid = expected[k][:, 1:]  # the class token's entry dropped, the 14x14 grid resized
            torch.testing.assert_close(v, resize_pos_embed(grid, (14, 14), (64, 64)))
        else:
            assert torch.equal(v, expected[k]), k
    dropped = next(line for line in caplog.text.splitlines() if "dropped (a classifier that does not fit" in line)
    assert "cls_token" in dropped
    assert f"new relative-position tables, left at zero: {len(tables)} tensors" in caplog.text


def test_win_optimizer_takes_no_weight_decay_from_the_core_and_decays_tables_with_their_block():
    """The relative-position tables get weight_decay=0 because the core's no_weight_decay()
    names them (detectron2 matches overrides by a parameter's own name); nothing else is
    caught by those names; a table's lr factor is its block's."""
    cfg = tiny(os.path.join(CONFIGS, "mask_rcnn_srvit_s_t3_win.py"), "model.backbone.net.window_size=2")
    model = instantiate(cfg.model)
    net = model.backbone.net.srvit
    cfg.optimizer.params.model = model
    group_of = {id(p): g for g in instantiate(cfg.optimizer).param_groups for p in g["params"]}
    no_decay = {PREFIX + n for n in net.no_weight_decay()}
    assert sum(is_rel_pos(n) for n in no_decay) == 2 * (11 + 5)  # window tables of 11 blocks, global of 5
    norms = {f"{m}.{n}" for m, module in model.named_modules() if isinstance(module, torch.nn.LayerNorm)
             for n, _ in module.named_parameters(recurse=False)}
    params = dict(model.named_parameters())
    for name, p in params.items():
        wd = group_of[id(p)]["weight_decay"]
        assert wd == (0.0 if name in no_decay | norms else cfg.optimizer.weight_decay), name
        if is_rel_pos(name):
            qkv = params[name.split(".attn.")[0] + ".attn.qkv.weight"]
            assert group_of[id(p)]["lr"] == group_of[id(qkv)]["lr"] < 1e-4, name


def _yacs_detector_cfg(size, *opts):
    cfg = get_cfg()
    add_srvit_config(cfg)
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.NAME = "build_srvit_sfp_backbone"
    cfg.MODEL.MASK_ON = True
    cfg.MODEL.RPN.IN_FEATURES = ["p2", "p3", "p4", "p5", "p6"]
    cfg.MODEL.ROI_HEADS.IN_FEATURES = ["p2", "p3", "p4", "p5"]
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[32], [64], [128], [256], [512]]
    cfg.MODEL.ROI_HEADS.NAME = "StandardROIHeads"
    cfg.MODEL.ROI_BOX_HEAD.NAME = "FastRCNNConvFCHead"
    cfg.MODEL.ROI_BOX_HEAD.NUM_FC = 2
    cfg.MODEL.ROI_MASK_HEAD.NAME = "MaskRCNNConvUpsampleHead"
    cfg.merge_from_list(["MODEL.SRVIT.VARIANT", "srvit_t_t2", "MODEL.SRVIT.IMG_SIZE", str(size),
                         "MODEL.SRVIT.SFP.SQUARE_PAD", str(size), *opts])
    return cfg


def test_yacs_keys_build_a_windowed_backbone_and_load_its_checkpoint(tmp_path):
    """WINDOW_SIZE / USE_REL_POS / GLOBAL_ATTN_INDEXES as the LazyConfig keys, given as on a
    command line; PREFER_EMA / ALLOW_PARTIAL read by SRViTCheckpointer."""
    win = ["MODEL.SRVIT.WINDOW_SIZE", "2", "MODEL.SRVIT.USE_REL_POS", "True", "MODEL.SRVIT.GLOBAL_ATTN_INDEXES",
           "[0, 5]"]
    model = build_model(_yacs_detector_cfg(64, *win)).eval()
    net = model.backbone.net.srvit
    assert [u.window_sizes for u in net.units] == [[0], [2, 2, 2, 2, 0, 2], [2, 2, 2, 2], [2, 2], [2]]
    assert net.cls_token is None and any(is_rel_pos(n) for n, _ in net.named_parameters())
    with torch.no_grad():
        assert "instances" in model([{"image": torch.randint(0, 255, (3, 48, 64), dtype=torch.uint8)}])[0]
    assert not build_model(_yacs_detector_cfg(64)).backbone.net.srvit.units[1].window_sizes[0]  # default: global

    weights, ema = (create_srvit("srvit_t_t2", img_size=64) for _ in range(2))  # class-token pretraining
    path = str(tmp_path / "pre.pth")
    torch.save({"model": weights.state_dict(), "model_ema": ema.state_dict()}, path)
    model = build_model(_yacs_detector_cfg(64, *win, "MODEL.SRVIT.PREFER_EMA", "True"))
    SRViTCheckpointer(model).load(path)
    loaded = model.backbone.net.srvit.state_dict()
    assert torch.equal(loaded["units.1.blocks.2.mlp.fc1.weight"], ema.state_dict()["units.1.blocks.2.mlp.fc1.weight"])
    assert torch.equal(loaded["pos_embed"], ema.pos_embed[:, 1:])

    partial = str(tmp_path / "partial.pth")
    torch.save({k: v for k, v in weights.state_dict().items() if not k.startswith("units.2.")}, partial)
    with pytest.raises(CheckpointError, match="units.2"):
        SRViTCheckpointer(build_model(_yacs_detector_cfg(64, *win))).load(partial)
    model = build_model(_yacs_detector_cfg(64, *win, "MODEL.SRVIT.ALLOW_PARTIAL", "True"))
    SRViTCheckpointer(model).load(partial)
    assert torch.equal(model.backbone.net.srvit.units[1].router.weight, weights.units[1].router.weight)


# ----------------------------------------------------------------------------- the zoo: cascade/ and lvis/
CASCADE = ["model.roi_heads.box_heads.{i}.input_shape.channels=64", "model.roi_heads.box_heads.{i}.conv_dims=[64,64]",
           "model.roi_heads.box_heads.{i}.fc_dims=[64]", "model.roi_heads.box_predictors.{i}.input_shape.channels=64"]
ZOO_VARIANTS = {"srvit_s_t3", "srvit_s_t3_win", "srvit_b_t3_win", "deit_s_win"}
LVIS_CHANGES = dict(test_score_thresh=0.02, test_topk_per_image=300, use_sigmoid_ce=True, use_fed_loss=True)


def zoo_name(path):
    return os.path.relpath(path, CONFIGS)


def is_cascade(path):
    return os.path.basename(path).startswith("cascade_")


def tiny_overrides(path):
    """TINY for any shipped config: a cascade's three box heads and predictors shrunk as TINY shrinks
    Mask R-CNN's one."""
    if not is_cascade(path):
        return list(TINY)
    return [o for o in TINY if not o.startswith(("model.roi_heads.box_head.", "model.roi_heads.box_predictor."))] + \
        [o.format(i=i) for i in range(3) for o in CASCADE]


@pytest.fixture(scope="module")
def lvis_root(tmp_path_factory):
    """Synthetic LVIS v1 in detectron2's layout (data/coco/*2017, data/lvis/lvis_v1_*.json)."""
    root = tmp_path_factory.mktemp("d2lvis")
    load_tool("make_synthetic_lvis").main(["--root", str(root / "data"), "--train", "4", "--val", "2",
                                           "--size", "64", "80"])
    return root


@pytest.fixture(scope="module")
def lvis_names(lvis_root):
    """Overrides that read the synthetic LVIS in this process, registered as detectron2 registers
    lvis_v1_train / lvis_v1_val (LVIS v1's metadata: 1203 classes and their image counts)."""
    from detectron2.data import DatasetCatalog
    from detectron2.data.datasets import register_lvis_instances
    from detectron2.data.datasets.lvis import get_lvis_instances_meta

    names = {}
    for split in ("train", "val"):
        names[split] = f"srvit_synthetic_lvis_v1_{split}_{abs(hash(str(lvis_root)))}"
        if names[split] not in DatasetCatalog.list():
            register_lvis_instances(names[split], get_lvis_instances_meta("lvis_v1"),
                                    str(lvis_root / "data" / "lvis" / f"lvis_v1_{split}.json"),
                                    str(lvis_root / "data" / "coco") + os.sep)
    return [f"dataloader.train.dataset.names={names['train']}", f"dataloader.test.dataset.names={names['val']}"]


def zoo_config(path, lvis_names, *overrides):
    data = lvis_names if zoo_name(path).startswith("lvis") else []
    return validate_config(LazyConfig.apply_overrides(LazyConfig.load(path),
                                                      tiny_overrides(path) + data + list(overrides)))


def box_predictors(cfg_or_model):
    """A config's or a built model's box predictors (a cascade's ModuleList, Mask R-CNN's one)."""
    roi = cfg_or_model.roi_heads
    if isinstance(roi, torch.nn.Module):
        return list(roi.box_predictor) if isinstance(roi.box_predictor, torch.nn.ModuleList) else [roi.box_predictor]
    return list(roi.box_predictors) if "box_predictors" in roi else [roi.box_predictor]


@pytest.mark.parametrize("path", ZOO, ids=zoo_name)
def test_every_zoo_config_trains_one_step(path, lvis_names):
    """test_every_config_trains_one_step for cascade/ and lvis/: every parameter gets a gradient,
    the optimizer holds each; the cascade's three stages each add their losses; the LVIS
    predictors weight the federated loss by LVIS v1's image counts to the power 0.5."""
    cfg = zoo_config(path, lvis_names)
    model = assert_one_step_trains_every_parameter(cfg, path)
    if zoo_name(path).startswith("lvis"):
        from detectron2.data.datasets.lvis_v1_category_image_count import LVIS_CATEGORY_IMAGE_COUNT

        counts = torch.tensor([c["image_count"] for c in sorted(LVIS_CATEGORY_IMAGE_COUNT, key=lambda c: c["id"])])
        for predictor in box_predictors(model):
            assert predictor.num_classes == 1203 and predictor.use_sigmoid_ce and predictor.use_fed_loss
            assert torch.equal(predictor.fed_loss_cls_weights, counts.float() ** 0.5)


def without(cfg, roi_keys=(), predictor_keys=()):
    """The config as a plain dict, without these roi_heads keys and box-predictor keys."""
    tree = OmegaConf.to_container(cfg)
    roi = tree["model"]["roi_heads"]
    for key in roi_keys:
        del roi[key]
    for predictor in roi.get("box_predictors", []) + ([roi["box_predictor"]] if "box_predictor" in roi else []):
        for key in predictor_keys:
            predictor.pop(key, None)
    return tree


def test_the_zoo_holds_every_flagship_variant_on_its_mask_rcnn():
    names = {zoo_name(p) for p in ZOO}
    assert names == {f"cascade/cascade_mask_rcnn_{v}.py" for v in ZOO_VARIANTS} | \
        {f"lvis/{d}_{v}.py" for v in ZOO_VARIANTS for d in ("mask_rcnn", "cascade_mask_rcnn")}
    assert all(os.path.isfile(os.path.join(CONFIGS, f"mask_rcnn_{v}.py")) for v in ZOO_VARIANTS)


@pytest.mark.parametrize("variant", sorted(ZOO_VARIANTS))
def test_cascade_is_its_mask_rcnn_with_vitdets_three_stages(variant):
    """cascade/X: ViTDet's cascade heads (4 convs + 1 fc with LN per stage, box weights (10, 5) /
    (20, 10) / (30, 15), IoU 0.5 / 0.6 / 0.7, class-agnostic regression), and nothing else changed
    from mask_rcnn_X (backbone, recipe, schedule, layer decay, checkpoint)."""
    from detectron2.modeling.roi_heads import CascadeROIHeads

    cascade, base = load(f"cascade/cascade_mask_rcnn_{variant}.py"), load(f"mask_rcnn_{variant}.py")
    roi = cascade.model.roi_heads
    assert roi._target_ is CascadeROIHeads
    assert [(tuple(h.conv_dims), tuple(h.fc_dims), h.conv_norm, h.input_shape.channels) for h in roi.box_heads] == \
        [((256,) * 4, (1024,), "LN", 256)] * 3
    assert [tuple(p.box2box_transform.weights) for p in roi.box_predictors] == \
        [(10, 10, 5, 5), (20, 20, 10, 10), (30, 30, 15, 15)]
    assert all(p.cls_agnostic_bbox_reg and p.test_score_thresh == 0.05
               and OmegaConf.to_container(p)["num_classes"] == "${...num_classes}"
               for p in roi.box_predictors)
    assert [(tuple(m.thresholds), tuple(m.labels), m.allow_low_quality_matches) for m in roi.proposal_matchers] == \
        [((0.5,), (0, 1), False), ((0.6,), (0, 1), False), ((0.7,), (0, 1), False)]
    assert without(cascade, ("_target_", "box_heads", "box_predictors", "proposal_matchers")) == \
        without(base, ("_target_", "box_head", "box_predictor", "proposal_matcher"))


@pytest.mark.parametrize("name", sorted(f"{d}_{v}.py" for v in ZOO_VARIANTS
                                        for d in ("mask_rcnn", "cascade_mask_rcnn")))
def test_lvis_is_its_coco_config_with_vitdets_lvis_settings(name):
    """lvis/X: ViTDet's LVIS settings (repeat-factor sampling at 0.001, LVISEvaluator (ours, which
    evaluates under numpy 2) with 300 detections, 1203 classes, sigmoid CE + federated loss, score
    threshold 0.02, top 300 in every box predictor) and the COCO recipe's schedule over LVIS's
    epochs at ViTDet's LVIS / COCO lr ratio and LVIS eval period; nothing else changed from the
    COCO config (cascade/X or X)."""
    from detectron2.data.samplers import RepeatFactorTrainingSampler

    from srvit_backbones.detectron2 import SRViTLVISEvaluator

    lvis = load(f"lvis/{name}")
    coco = load(f"cascade/{name}" if name.startswith("cascade") else name)
    data = lvis.dataloader
    assert (data.train.dataset.names, data.test.dataset.names) == ("lvis_v1_train", "lvis_v1_val")
    assert data.train.sampler._target_ is RepeatFactorTrainingSampler
    factors = OmegaConf.to_container(data.train.sampler.repeat_factors)  # interpolations unresolved
    assert (factors["repeat_thresh"], factors["dataset_dicts"]) == (0.001, "${dataloader.train.dataset}")
    assert (data.evaluator._target_, data.evaluator.max_dets_per_image) == (SRViTLVISEvaluator, 300)
    assert lvis.model.roi_heads.num_classes == 1203
    for predictor in box_predictors(lvis.model):
        assert {k: predictor[k] for k in LVIS_CHANGES} == LVIS_CHANGES
        weights = OmegaConf.to_container(predictor.get_fed_loss_cls_weights)
        assert (weights["dataset_names"], weights["freq_weight_power"]) == ("${dataloader.train.dataset.names}", 0.5)
    assert lvis.train.max_iter == round(coco.train.max_iter * 156250 / 184375)  # ViTDet's LVIS / COCO iterations
    warmup = coco.lr_multiplier.warmup_length * coco.train.max_iter
    assert lvis.lr_multiplier.warmup_length * lvis.train.max_iter == pytest.approx(warmup)
    # ViTDet's lr: 2e-4 in projects/ViTDet/configs/LVIS/mask_rcnn_vitdet_b_100ep.py, 1e-4 in
    # COCO/mask_rcnn_vitdet_b_100ep.py (configs/common/optim.py's AdamW), the same batch of 64
    assert lvis.optimizer.lr / coco.optimizer.lr == pytest.approx(2e-4 / 1e-4)
    assert lvis.optimizer.params.lr_decay == coco.optimizer.params.lr_decay
    assert lvis.train.eval_period == 30000  # train.eval_period of LVIS/mask_rcnn_vitdet_b_100ep.py
    assert lvis.train.checkpointer.period == coco.train.checkpointer.period

    lvis_tree = without(lvis, ("num_classes",), ("get_fed_loss_cls_weights", *LVIS_CHANGES))
    coco_tree = without(coco, ("num_classes",), ("get_fed_loss_cls_weights", *LVIS_CHANGES))
    for tree in (lvis_tree, coco_tree):
        del tree["dataloader"], tree["train"]["max_iter"], tree["lr_multiplier"]["warmup_length"]
        del tree["optimizer"]["lr"], tree["train"]["eval_period"]
    assert lvis_tree == coco_tree
    train_data = OmegaConf.to_container(data.train)
    del train_data["sampler"], train_data["dataset"]["names"]
    coco_data = OmegaConf.to_container(coco.dataloader.train)
    del coco_data["dataset"]["names"]
    assert train_data == coco_data  # the same LSJ at 1024


def test_lvis_cascade_trains_and_lvis_evaluator_returns_ap(lvis_names):
    """The LVIS Cascade Mask R-CNN (both new heads and the LVIS recipe in one run): a few
    iterations through the config's own LVIS data path (repeat-factor sampler, LSJ mapper) and its
    LVISEvaluator on synthetic LVIS v1: box and mask AP with the rare / common / frequent split (the
    untrained detector's score threshold lowered, as for the COCO runs, and its top-k, for time),
    under numpy 2, with lvis.eval left as it was."""
    from detectron2.data.samplers import RepeatFactorTrainingSampler
    from detectron2.engine import SimpleTrainer
    from detectron2.evaluation import inference_on_dataset

    path = os.path.join(CONFIGS, "lvis", "cascade_mask_rcnn_srvit_s_t3.py")
    test = [f"model.roi_heads.box_predictors.{i}.{key}" for i in range(3)
            for key in ("test_score_thresh=0.0", "test_topk_per_image=20")]
    cfg = zoo_config(path, lvis_names, *test, "dataloader.train.mapper.augmentations.1.min_scale=0.8")
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    cfg.optimizer.params.model = model
    assert isinstance(instantiate(cfg.dataloader.train.sampler), RepeatFactorTrainingSampler)
    trainer = SimpleTrainer(model, instantiate(cfg.dataloader.train), instantiate(cfg.optimizer))
    trainer.train(0, 3)
    losses = [v for v, _ in trainer.storage.history("total_loss").values()]
    assert len(losses) == 3 and all(map(math.isfinite, losses))
    results = inference_on_dataset(model.eval(), instantiate(cfg.dataloader.test),
                                   instantiate(cfg.dataloader.evaluator))
    for task in ("bbox", "segm"):
        assert {"AP", "AP50", "APr", "APc", "APf"} <= set(results[task]), results
        assert all(0 <= results[task][k] <= 100 for k in ("AP", "AP50", "APr", "APc", "APf")), results
    assert sys.modules["lvis.eval"].np is np  # lvis's numpy 2 alias lived only inside our evaluator


def test_an_lvis_config_on_a_coco_file_is_explained(coco_root, lvis_names):
    """An LVIS config pointed at a COCO-format annotation file fails in tools/train_net.py before
    anything is built, naming the missing field and the fix (else: COCO's ids read as LVIS's, and a
    KeyError at the first evaluation)."""
    from srvit_backbones.data.lvis import LVISFormatError, check_lvis_annotations

    coco_json = str(coco_root / "data" / "coco" / "annotations" / "instances_val2017.json")
    with pytest.raises(LVISFormatError, match=r"80 of its 80 categories \('person', id 1\) lack the 'frequency' field"):
        check_lvis_annotations(coco_json)
    coco_names = in_process_data(coco_root)
    args = train_net_args(["--config", "lvis/mask_rcnn_srvit_s_t3.py", "train.device=cpu", "train.amp.enabled=False",
                           lvis_names[0], coco_names[1]])
    with pytest.raises(ConfigError, match=r"^config error: dataloader.test.dataset.names="
                                          r"'srvit_synthetic_coco_val_\d+': its file .* lack the 'frequency' field "
                                          r".*lvis_v1_train.json / lvis_v1_val.json"):
        train_net.check_config(train_net.load_config(args))


# ----------------------------------------------------------------------------- compiled training
QUICKSTART_WIN = os.path.join(CONFIGS, "quickstart", "mask_rcnn_srvit_tiny_win_cpu.py")
# the windowed quickstart at 96 pixels with one recursive block (T=2): 4 applications, windowed
# (4x4 windows padded on the 6x6 patch grid) and global in turn; a small graph to compile
COMPILED_TINY = [o for o in TINY if not o.startswith(("model.backbone.net.img_size", "model.backbone.square_pad"))] + \
    ["model.backbone.net.img_size=96", "model.backbone.square_pad=96", "model.backbone.net.layout=[1]"]


def _compiled_ddp_worker(rank):
    from detectron2.engine import SimpleTrainer
    from detectron2.engine.defaults import create_ddp_model

    from helpers import assert_compiled_training_equals_eager
    from srvit_backbones.detectron2 import training
    from srvit_backbones.detectron2.benchmark import synthetic_detection_batch

    batch = synthetic_detection_batch(1, 96, seed=rank)  # each rank its own image

    def train(compile):
        cfg = training.load_config(QUICKSTART_WIN, COMPILED_TINY)
        cfg.model.backbone.net.compile = compile
        torch.manual_seed(0)
        model = training.build_model(cfg)
        ddp = create_ddp_model(model, **train_net.ddp_kwargs(cfg))  # as tools/train_net.py wraps it
        losses = []
        model.register_forward_hook(lambda module, inputs, loss_dict: losses.append(sum(loss_dict.values()).item()))
        SimpleTrainer(ddp, iter([batch] * 2), training.build_optimizer(cfg, model)).train(0, 2)
        return torch.tensor(losses), model

    differences = assert_compiled_training_equals_eager(train)
    print(f"rank {rank}: compiled - eager after 2 steps: {differences}")


def test_compiled_backbone_trains_as_the_eager_one_under_two_process_ddp(tmp_path):
    """``model.backbone.net.compile`` (AOT autograd's graphs, run eagerly) under detectron2's DDP
    as tools/train_net.py wraps it (find_unused_parameters=False): two steps of the windowed
    quickstart detector (padded windows, relative positions, global applications) give the eager
    run's losses and weights, the same on both ranks."""
    assert LazyConfig.load(QUICKSTART_WIN).train.ddp.find_unused_parameters is False
    two_gloo_processes(_compiled_ddp_worker, tmp_path)
