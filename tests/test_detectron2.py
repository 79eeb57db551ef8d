"""Detectron2: the SR-ViT Mask R-CNN configs, the checkpointer, and tools/train_net.py end to end."""
import json
import os
import subprocess
import sys

import pytest
import torch
from detectron2.config import LazyConfig, get_cfg, instantiate
from detectron2.modeling import build_model

import srvit_backbones
from srvit_backbones import CheckpointError, create_srvit
from srvit_backbones.detectron2 import SRViTBackbone, SRViTCheckpointer, add_srvit_config
from srvit_backbones.layer_decay import lr_decay_factor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "detectron2_configs")
QUICKSTART = os.path.join(CONFIGS, "quickstart", "mask_rcnn_srvit_tiny_cpu.py")

# paper Table 4, whole detector (M)
TABLE4 = {"mask_rcnn_deit_s.py": 45.9, "mask_rcnn_srvit_s_t2.py": 46.5, "mask_rcnn_srvit_s_t3.py": 47.1,
          "mask_rcnn_srvit_s_t4.py": 47.7, "mask_rcnn_srvit_b_t2.py": 64.7, "mask_rcnn_srvit_b_t3.py": 65.8}


def load(name):
    return LazyConfig.load(os.path.join(CONFIGS, name))


@pytest.mark.parametrize("name,params", list(TABLE4.items()))
def test_detector_parameters_match_table4(name, params):
    cfg = load(name)
    assert cfg.model.backbone.net.img_size == 1024 and cfg.model.backbone.square_pad == 1024
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
    cfg = load("mask_rcnn_srvit_s_t3.py")
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
    cfg.MODEL.SRVIT.IMG_SIZE = 256
    cfg.MODEL.SRVIT.SFP.SQUARE_PAD = 256
    cfg.MODEL.MASK_ON = True
    cfg.MODEL.RPN.IN_FEATURES = cfg.MODEL.ROI_HEADS.IN_FEATURES = ["p2", "p3", "p4", "p5"]
    cfg.MODEL.RPN.IN_FEATURES = ["p2", "p3", "p4", "p5", "p6"]
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[32], [64], [128], [256], [512]]
    cfg.MODEL.ROI_HEADS.NAME = "StandardROIHeads"
    cfg.MODEL.ROI_BOX_HEAD.NAME = "FastRCNNConvFCHead"
    cfg.MODEL.ROI_BOX_HEAD.NUM_FC = 2
    cfg.MODEL.ROI_MASK_HEAD.NAME = "MaskRCNNConvUpsampleHead"
    model = build_model(cfg).eval()
    assert isinstance(model.backbone.net, SRViTBackbone)
    with torch.no_grad():
        out = model([{"image": torch.randint(0, 255, (3, 200, 240), dtype=torch.uint8)}])
    assert "instances" in out[0]


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
    resized = srvit_backbones.checkpoint.adapt_pos_embed(core.pos_embed.detach(), backbone)
    torch.testing.assert_close(backbone.pos_embed.detach(), resized)
    # same weights landed: the backbone's features equal the core model's on the same input
    core.eval()
    x = torch.randn(1, 3, 192, 192)
    with torch.no_grad():
        torch.testing.assert_close(model.backbone.net(x)["last_feat"],
                                   _core_with_table(core, backbone).forward_feature_maps(x)["last_feat"])


def _core_with_table(core, backbone):
    """The core model with the detector's resized position table (what loading should do)."""
    ref = create_srvit("srvit_t_t2", embed_dim=64, num_heads=2, img_size=192, num_classes=core.num_classes).eval()
    sd = core.state_dict()
    sd["pos_embed"] = backbone.pos_embed.detach().clone()
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
def run_train_net(tmp_path, *args, num_gpus=1, timeout=600):
    env = dict(os.environ, DETECTRON2_DATASETS=str(tmp_path / "data"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config", QUICKSTART,
           "--num-gpus", str(num_gpus), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path))
    return proc, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("d2")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_synthetic_coco.py"), "--root",
                    str(root / "data"), "--train", "16", "--val", "4", "--size", "128", "160"], check=True)
    return root


def test_train_eval_resume_end_to_end(coco_root):
    out = str(coco_root / "out")
    common = [f"train.output_dir={out}", "model.backbone.net.img_size=128", "model.backbone.square_pad=128",
              "dataloader.train.mapper.augmentations.1.target_height=128",
              "dataloader.train.mapper.augmentations.1.target_width=128",
              "dataloader.train.mapper.augmentations.2.crop_size=[128,128]",
              "dataloader.test.mapper.augmentations.0.short_edge_length=128",
              "dataloader.test.mapper.augmentations.0.max_size=128",
              "dataloader.train.total_batch_size=2", "train.log_period=2", "train.checkpointer.period=1000"]
    proc, log = run_train_net(coco_root, *common, "train.max_iter=16", "train.eval_period=16")
    assert proc.returncode == 0, log[-3000:]
    metrics = [json.loads(line) for line in open(os.path.join(out, "metrics.json"))]
    losses = [m["total_loss"] for m in metrics if "total_loss" in m]
    assert len(losses) >= 6 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-2:]) < sum(losses[:2]), losses
    assert "copypaste: Task: bbox" in log and "copypaste: Task: segm" in log
    assert os.path.exists(os.path.join(out, "model_final.pth"))

    proc, log = run_train_net(coco_root, "--resume", *common, "train.max_iter=18", "train.eval_period=1000")
    assert proc.returncode == 0, log[-3000:]
    assert "Starting training from iteration 16" in log

    proc, log = run_train_net(coco_root, "--eval-only", *common,
                              f"train.init_checkpoint={os.path.join(out, 'model_final.pth')}")
    assert proc.returncode == 0, log[-3000:]
    assert "copypaste: Task: bbox" in log and "copypaste: Task: segm" in log


def test_two_process_ddp_on_cpu(coco_root):
    out = str(coco_root / "ddp")
    proc, log = run_train_net(coco_root, f"train.output_dir={out}", "train.max_iter=3", "train.eval_period=1000",
                              "model.backbone.net.use_act_checkpoint=True", "dataloader.train.total_batch_size=2",
                              "train.log_period=1", num_gpus=2)
    assert proc.returncode == 0, log[-3000:]
    assert "iter: 2" in log


def load_train_net():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_net", os.path.join(ROOT, "tools", "train_net.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("override,error,match", [
    ("train.init_checkpoint=missing.pth", SystemExit, "train.init_checkpoint='missing.pth' does not exist"),
    ("model.backbone.net.variant=srvit_q_t2", ValueError, "unknown SR-ViT variant 'srvit_q_t2'"),
    ("model.backbone.square_pad=200", SystemExit, "square_pad=200 is not a multiple of the patch size 16"),
    ("model.backbone.square_pad=128", SystemExit, "192 pixels, larger than model.backbone.square_pad=128"),
    ("train.amp.enabled=True", SystemExit, "train.amp.enabled=True needs a GPU"),
])
def test_train_net_bad_input_is_explained(tmp_path, override, error, match):
    train_net = load_train_net()
    args = train_net.parse_args(["--config", QUICKSTART, f"train.output_dir={tmp_path}", override])
    with pytest.raises(error, match=match):
        train_net.main(args)
