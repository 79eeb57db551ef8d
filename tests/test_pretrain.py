"""tools/pretrain.py on the CPU with a generated ImageFolder: train, evaluate, resume,
distillation, the Table 8 recipe, and its checkpoints flowing into both frameworks."""
import importlib.util
import json
import os

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from srvit_backbones import create_srvit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_tool():
    spec = importlib.util.spec_from_file_location("pretrain_tool", os.path.join(ROOT, "tools", "pretrain.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("inet")
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 2)):
        for c, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                a = (rng.integers(0, 60, (40, 40, 3)) + np.array(colour) * 0.7).clip(0, 255).astype(np.uint8)
                Image.fromarray(a).save(d / f"{i}.jpg")
    return str(root)


def tiny_args(data, out, *extra):
    return ["--data", data, "--model", "srvit_t_t2", "--input-size", "32", "--batch-size", "4", "--workers", "0",
            "--max-iters-per-epoch", "2", "--log-interval", "1", "--output", str(out), *extra]


def test_train_evaluate_resume(image_folder, tmp_path, caplog):
    tool = load_tool()
    stats = tool.main(tiny_args(image_folder, tmp_path, "--epochs", "1", "--model-ema"))
    assert stats["images"] == 6 and 0 <= stats["top1"] <= 100 and "ema" in stats
    ckpt = torch.load(tmp_path / "last.pth", weights_only=True)  # safe to load
    assert ckpt["epoch"] == 0 and ckpt["variant"] == "srvit_t_t2" and "model_ema" in ckpt
    assert {"optimizer", "scheduler", "best_top1"} <= set(ckpt)
    caplog.set_level("INFO")
    tool.main(tiny_args(image_folder, tmp_path, "--epochs", "2", "--model-ema", "--resume", "auto"))
    assert "at epoch 1" in caplog.text
    lines = [json.loads(x) for x in open(tmp_path / "log.jsonl")]
    assert [x["epoch"] for x in lines] == [0, 1]
    assert torch.load(tmp_path / "last.pth", weights_only=True)["epoch"] == 1


def test_hard_distillation_with_a_tiny_teacher(image_folder, tmp_path):
    teacher = timm.create_model("resnet10t", num_classes=3)
    torch.save(teacher.state_dict(), tmp_path / "teacher.pth")
    stats = load_tool().main(tiny_args(image_folder, tmp_path, "--epochs", "1", "--distill", "--teacher",
                                       "resnet10t", "--teacher-weights", str(tmp_path / "teacher.pth")))
    assert stats["images"] == 6
    ckpt = torch.load(tmp_path / "last.pth", weights_only=True)
    assert "dist_token" in ckpt["model"] and "head_dist.weight" in ckpt["model"]


def test_recipe_defaults_match_table8(capsys):
    tool = load_tool()
    for model, warmup in (("srvit_s_t2", 5), ("srvit_s_t3", 10), ("srvit_s_t4", 20)):
        tool.main(["--model", model, "--dry-run"])
        r = json.loads(capsys.readouterr().out)
        assert r["warmup_epochs"] == warmup
    assert (r["epochs"], r["batch_size"], r["lr"], r["lr_base_batch"], r["weight_decay"]) == (300, 1024, 1e-3, 1024, 0.05)
    assert (r["sched"], r["auto_augment"], r["aug_repeats"], r["reprob"]) == ("cosine", "rand-m9-mstd0.5-inc1", 3, 0.25)
    assert (r["mixup"], r["cutmix"], r["smoothing"], r["crop_pct"], r["input_size"]) == (0.8, 1.0, 0.1, 0.875, 224)
    assert r["teacher"] == "regnety_160"
    tool.main(["--model", "srvit_s_t3", "--dry-run", "--finetune-384", "x.pth"])
    r = json.loads(capsys.readouterr().out)
    assert (r["epochs"], r["batch_size"], r["lr"], r["crop_pct"], r["input_size"]) == (30, 512, 1e-5, 1.0, 384)


def test_bad_input_is_explained(image_folder, tmp_path):
    tool = load_tool()
    with pytest.raises(SystemExit, match="does not exist: --data must contain train/ and val/"):
        tool.main(tiny_args(str(tmp_path / "nowhere"), tmp_path))
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "empty" / "val").mkdir()
    with pytest.raises(SystemExit, match="has no class folders"):
        tool.main(tiny_args(str(tmp_path / "empty"), tmp_path))
    with pytest.raises(SystemExit, match="unknown SR-ViT variant 'srvit_z'"):
        tool.main(["--model", "srvit_z", "--dry-run"])
    other = tmp_path / "other.pth"
    torch.save({"model": {}, "variant": "srvit_s_t3", "num_classes": 3}, other)
    with pytest.raises(SystemExit, match="checkpoint of 'srvit_s_t3'.*not of 'srvit_t_t2'"):
        tool.main(tiny_args(image_folder, tmp_path, "--epochs", "1", "--resume", str(other)))


def test_pretraining_checkpoint_flows_into_both_frameworks(image_folder, tmp_path):
    load_tool().main(tiny_args(image_folder, tmp_path, "--epochs", "1", "--input-size", "32"))
    path = str(tmp_path / "last.pth")
    sd = torch.load(path, weights_only=True)["model"]
    # the reference: the core model with the pretrained weights, its table resized to 64x64 input
    core = create_srvit("srvit_t_t2", num_classes=3, img_size=32)
    core.load_state_dict(sd)
    ref = create_srvit("srvit_t_t2", num_classes=0, img_size=64).eval()
    from srvit_backbones.checkpoint import adapt_pos_embed

    ref_sd = {k: v for k, v in sd.items() if not k.startswith("head")}
    ref_sd["pos_embed"] = adapt_pos_embed(sd["pos_embed"], ref)
    ref.load_state_dict(ref_sd)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = ref.forward_feature_maps(x, indices=[1, 2, 3, 4])  # mmseg's default for SR-ViT-T

    from srvit_backbones.detectron2 import SRViTBackbone, SRViTCheckpointer

    d2 = SRViTBackbone("srvit_t_t2", img_size=64, out_features=["last_feat", "unit1", "unit3"]).eval()
    SRViTCheckpointer(d2).load(path)
    with torch.no_grad():
        got = d2(x)
    for name in ("last_feat", "unit1", "unit3"):
        torch.testing.assert_close(got[name], expected[name])

    from mmseg.registry import MODELS

    import srvit_backbones.mmseg  # noqa: F401

    seg = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=64,
                            init_cfg=dict(type="Pretrained", checkpoint=path))).eval()
    seg.init_weights()
    with torch.no_grad():
        outs = seg(x)
    for i, out in zip(seg.out_indices, outs):
        torch.testing.assert_close(out, expected[f"unit{i}"])


def test_convert_checkpoint_keeps_ema_and_resizes(tmp_path):
    spec = importlib.util.spec_from_file_location("convert", os.path.join(ROOT, "tools", "convert_checkpoint.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    src = create_srvit("srvit_t_t2", num_classes=3)
    ema = create_srvit("srvit_t_t2", num_classes=3)
    torch.save({"model": src.state_dict(), "model_ema": ema.state_dict()}, tmp_path / "in.pth")
    report = tool.main([str(tmp_path / "in.pth"), str(tmp_path / "out.pth"), "--model", "srvit_t_t2", "--ema",
                        "--img-size", "64"])
    assert set(report.dropped) == {"head.weight", "head.bias"} and not report.missing
    out = torch.load(tmp_path / "out.pth", weights_only=True)["model"]
    assert out["pos_embed"].shape == (1, 17, 384) and "head.weight" not in out
    torch.testing.assert_close(out["units.1.blocks.0.attn.qkv.weight"], ema.state_dict()["units.1.blocks.0.attn.qkv.weight"])
    # a checkpoint with Python objects is refused safely, and re-saved with --trust
    import argparse as ap

    torch.save({"model": src.state_dict(), "args": ap.Namespace(lr=1)}, tmp_path / "pickled.pth")
    with pytest.raises(ValueError, match=r"argparse.Namespace.*refuses to unpickle safely.*--trust"):
        tool.main([str(tmp_path / "pickled.pth"), str(tmp_path / "o2.pth"), "--model", "srvit_t_t2"])
    tool.main([str(tmp_path / "pickled.pth"), str(tmp_path / "o2.pth"), "--model", "srvit_t_t2", "--trust"])


def test_torchrun_two_processes_with_repeated_augmentation(image_folder, tmp_path):
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
           os.path.join(ROOT, "tools", "pretrain.py"), *tiny_args(image_folder, tmp_path, "--epochs", "1",
                                                                  "--device", "cpu")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "repeated augmentation" not in log  # on: the sampler is timm's RepeatAugSampler
    assert "top-1" in log and "(6 images)" in log  # evaluation reduced over both processes
    assert torch.load(tmp_path / "last.pth", weights_only=True)["epoch"] == 0
