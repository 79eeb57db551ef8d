"""MMSegmentation: the SR-ViT backbone, the layer-decay constructor, the configs, and
mmseg's own tools/train.py / tools/test.py end to end on synthetic ADE20K-layout data."""
import glob
import json
import os
import subprocess
import sys

import mmseg
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmseg.registry import MODELS
from mmseg.utils import register_all_modules

import srvit_backbones
import srvit_backbones.mmseg  # noqa: F401  (registers SRViT)
from srvit_backbones import CheckpointError, create_srvit
from srvit_backbones.layer_decay import lr_decay_factor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "mmseg_configs")
QUICKSTART = os.path.join(CONFIGS, "quickstart", "upernet_srvit_tiny_cpu.py")
MMSEG_TOOLS = os.path.join(os.path.dirname(mmseg.__file__), ".mim", "tools")

register_all_modules()

# paper Table 4, whole segmentor (M)
TABLE4 = {"upernet_deit_s.py": 36.9, "upernet_srvit_s_t2.py": 37.5, "upernet_srvit_s.py": 38.1,
          "upernet_srvit_s_t4.py": 38.7}


def build(name_or_path, **backbone):
    path = name_or_path if os.path.isabs(name_or_path) else os.path.join(CONFIGS, name_or_path)
    cfg = Config.fromfile(path)
    cfg.model.backbone.update(backbone)
    return cfg, MODELS.build(cfg.model)


@pytest.mark.parametrize("name,params", list(TABLE4.items()))
def test_segmentor_parameters_match_table4(name, params):
    _, model = build(name)
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - params) < 0.5


def test_every_variant_config_exists_and_holds_the_recipe():
    names = ["upernet_srvit_s.py"] + [f"upernet_srvit_{v}.py" for v in ("s_t2", "s_t4", "b_t2", "b_t3", "t_t2", "t_t3")]
    assert set(names + ["upernet_deit_s.py"]) <= set(srvit_backbones.list_configs("mmseg"))
    cfg = Config.fromfile(os.path.join(CONFIGS, "upernet_srvit_s.py"))
    assert cfg.model.backbone.variant == "srvit_s_t3" and cfg.custom_imports.imports == ["srvit_backbones.mmseg"]
    assert cfg.train_cfg.max_iters == 160000 and cfg.train_dataloader.batch_size == 2
    assert cfg.optim_wrapper.optimizer == dict(type="AdamW", lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)
    warmup, poly = cfg.param_scheduler
    assert warmup.type == "LinearLR" and warmup.end == 1500 and poly.type == "PolyLR" and poly.begin == 1500
    assert cfg.crop_size == (512, 512) and cfg.model.neck.scales == [4, 2, 1, 0.5]
    ratios = [t.scale_factor for t in cfg.tta_pipeline[1].transforms[0]]
    assert ratios == [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    deit = Config.fromfile(os.path.join(CONFIGS, "upernet_deit_s.py"))
    assert deit.model.backbone.out_indices == (2, 5, 8, 11)
    _, b = build("upernet_srvit_b_t2.py")
    assert b.backbone.srvit.embed_dim == 512 and b.neck.convs[0].conv.out_channels == 512


def test_backbone_outputs_recursive_units_as_nchw_maps():
    backbone = MODELS.build(dict(type="SRViT", variant="srvit_s_t2", img_size=64, embed_dim=64, num_heads=2))
    assert backbone.out_indices == [1, 2, 3, 4]
    outs = backbone(torch.randn(2, 3, 64, 96))
    assert [o.shape for o in outs] == [(2, 64, 4, 6)] * 4
    deit = MODELS.build(dict(type="SRViT", variant="srvit_deit_s", img_size=64))
    assert deit.out_indices == [2, 5, 8, 11]
    tiny = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=64))
    assert tiny.out_indices == [1, 2, 3, 4]  # three recursive units + the last block


def test_bad_backbone_input_is_explained(tmp_path):
    with pytest.raises(ValueError, match="feature index 7 does not exist"):
        MODELS.build(dict(type="SRViT", variant="srvit_s_t2", img_size=64, out_indices=(1, 7)))
    backbone = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=64, embed_dim=32, num_heads=2))
    with pytest.raises(ValueError, match="120x120 is not a multiple of the patch size 16.*size_divisor"):
        backbone(torch.randn(1, 3, 120, 120))
    for variant, kw, match in [("srvit_t_t2", dict(embed_dim=64, num_heads=2), "width is 64, the model's 32"),
                               ("srvit_t_t3", dict(embed_dim=32, num_heads=2), r"T=\[3\], the model's T=2")]:
        path = str(tmp_path / f"{variant}.pth")
        torch.save({"model": create_srvit(variant, **kw).state_dict()}, path)
        backbone = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=64, embed_dim=32, num_heads=2,
                                     init_cfg=dict(type="Pretrained", checkpoint=path)))
        with pytest.raises(CheckpointError, match=match):
            backbone.init_weights()


def test_pretrained_checkpoint_loads_with_resized_pos_embed(tmp_path):
    core = create_srvit("srvit_t_t2", embed_dim=32, num_heads=2).eval()  # 224: 14x14 table
    path = str(tmp_path / "pre.pth")
    torch.save({"model": core.state_dict(), "model_ema": core.state_dict()}, path)
    backbone = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=128, embed_dim=32, num_heads=2,
                                 init_cfg=dict(type="Pretrained", checkpoint=path))).eval()
    backbone.init_weights()
    ref = create_srvit("srvit_t_t2", embed_dim=32, num_heads=2, img_size=128).eval()
    sd = core.state_dict()
    sd["pos_embed"] = srvit_backbones.checkpoint.adapt_pos_embed(core.pos_embed.detach(), ref)
    ref.load_state_dict(sd)
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        outs = backbone(x)
        feats = ref.forward_feature_maps(x, indices=backbone.out_indices)
    for i, out in zip(backbone.out_indices, outs):
        torch.testing.assert_close(out, feats[f"unit{i}"])


def test_layer_decay_matches_the_detectron2_rule():
    cfg, model = build("upernet_srvit_s.py")
    cfg.optim_wrapper.paramwise_cfg.layer_decay_rate = 0.7
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    scale_of, wd_of = {}, {}
    for group in wrapper.optimizer.param_groups:
        for p in group["params"]:
            scale_of[id(p)] = group["lr"] / 6e-5
            wd_of[id(p)] = group["weight_decay"]
    named = dict(model.named_parameters())
    sizes = model.backbone.srvit.unit_sizes
    for name, p in named.items():
        # the same factor detectron2's lr_factor_func gives the same core parameter
        core_name = name[len("backbone.srvit."):] if name.startswith("backbone.srvit.") else None
        expected = lr_decay_factor(core_name, 0.7, sizes) if core_name else 1.0
        d2_name = "backbone.net.srvit." + core_name if core_name else "roi_heads.x"
        assert expected == pytest.approx(lr_decay_factor(d2_name, 0.7, sizes, "backbone.net.srvit."))
        assert scale_of[id(p)] == pytest.approx(expected), name
    assert wd_of[id(named["backbone.srvit.pos_embed"])] == 0.0
    assert wd_of[id(named["backbone.srvit.units.1.blocks.0.attn.qkv.weight"])] == 0.01
    assert wd_of[id(named["backbone.srvit.units.1.blocks.0.norm1.weight"])] == 0.0


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def seg_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("seg")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_synthetic_ade20k.py"), "--root",
                    str(root / "datasets"), "--train", "8", "--val", "3", "--size", "96", "128"], check=True)
    return root


def run(root, script, *args, timeout=900):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, script, *args], cwd=str(root), env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc, proc.stdout + proc.stderr


def scalars(work_dir):
    files = sorted(glob.glob(os.path.join(work_dir, "*", "vis_data", "scalars.json")))
    return [json.loads(line) for f in files for line in open(f)]


SMALL = ["train_cfg.max_iters=24", "train_cfg.val_interval=24", "default_hooks.logger.interval=2",
         "default_hooks.checkpoint.interval=24", "train_dataloader.batch_size=2",
         "param_scheduler.0.end=2", "param_scheduler.1.begin=2", "param_scheduler.1.end=24"]


def test_mmseg_own_train_test_and_resume(seg_root):
    work = str(seg_root / "work")
    proc, log = run(seg_root, os.path.join(MMSEG_TOOLS, "train.py"), QUICKSTART, "--work-dir", work,
                    "--cfg-options", *SMALL)
    assert proc.returncode == 0, log[-3000:]
    losses = [s["loss"] for s in scalars(work) if "loss" in s]
    assert len(losses) >= 5 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) < sum(losses[:3]), losses
    assert "mIoU" in log and os.path.exists(os.path.join(work, "iter_24.pth"))

    resumed = [o.replace("max_iters=24", "max_iters=26").replace("end=24", "end=26") for o in SMALL]
    proc, log = run(seg_root, os.path.join(MMSEG_TOOLS, "train.py"), QUICKSTART, "--work-dir", work, "--resume",
                    "--cfg-options", *resumed, "train_cfg.val_interval=1000")
    assert proc.returncode == 0, log[-3000:]
    assert "resumed" in log.lower() and "Iter(train) [26/26]" in log

    proc, log = run(seg_root, os.path.join(MMSEG_TOOLS, "test.py"), QUICKSTART, os.path.join(work, "iter_24.pth"),
                    "--work-dir", work)
    assert proc.returncode == 0, log[-3000:]
    assert "mIoU" in log
    proc, log = run(seg_root, os.path.join(MMSEG_TOOLS, "test.py"), QUICKSTART, os.path.join(work, "iter_24.pth"),
                    "--work-dir", work, "--tta")
    assert proc.returncode == 0, log[-3000:]
    assert "mIoU" in log


def test_our_train_seg_and_test_seg(seg_root):
    work = str(seg_root / "ours")
    options = [o.replace("max_iters=24", "max_iters=4").replace("end=24", "end=4").replace("interval=24", "interval=4")
               for o in SMALL]
    proc, log = run(seg_root, os.path.join(ROOT, "tools", "train_seg.py"), QUICKSTART, "--work-dir", work,
                    "--cfg-options", *options)
    assert proc.returncode == 0, log[-3000:]
    assert "mIoU" in log
    proc, log = run(seg_root, os.path.join(ROOT, "tools", "test_seg.py"), "quickstart/upernet_srvit_tiny_cpu.py",
                    os.path.join(work, "iter_4.pth"), "--work-dir", work)
    assert proc.returncode == 0, log[-3000:]
    assert "mIoU" in log
    proc, log = run(seg_root, os.path.join(ROOT, "tools", "test_seg.py"), QUICKSTART, "missing.pth")
    assert proc.returncode != 0 and "checkpoint 'missing.pth' does not exist" in log


def test_checkpoint_allow_list_is_narrow():
    from mmengine.logging import HistoryBuffer

    from srvit_backbones.mmseg.checkpoint_loading import history_buffer_attribute

    assert history_buffer_attribute(HistoryBuffer, "min") is HistoryBuffer.min
    for obj, name in ((HistoryBuffer, "__init__"), (os, "system"), (HistoryBuffer, "_statistics_methods")):
        with pytest.raises(Exception, match="refusing getattr"):
            history_buffer_attribute(obj, name)
