"""tools/visualize_mixture.py: router pictures of a pretraining, detectron2 or mmseg checkpoint
on a folder of real photos. The maps it draws are the loaded model's own mixture weights (the
checkpoint's weights landed), the statistics are what they claim, and bad requests are clear
errors."""
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from PIL import Image
from skimage import data

from helpers import load_tool, randomize_routers
from srvit_backbones import create_srvit, load_pretrained
from srvit_backbones.analysis.images import load_image, to_batch
from srvit_backbones.training.amp import cpu_has_native_bf16

ARCH = dict(embed_dim=64, num_heads=2, num_steps=3)
SET = ["--model", "srvit_t_t2", "--set", "embed_dim=64", "num_heads=2", "num_steps=3"]
UNITS = {1: 3, 2: 2, 3: 1}  # SR-ViT-T's recursive units: index -> blocks (R3, R2, R1)


tool = load_tool("visualize_mixture")


def trained_like(seed, img_size=64):
    """A tiny SR-ViT-T's layout at T=3 with a classifier and decided routers."""
    torch.manual_seed(seed)
    return randomize_routers(create_srvit("srvit_t_t2", img_size=img_size, num_classes=10, **ARCH)).eval()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three real photographs of different shapes, and a file that is not an image."""
    folder = tmp_path_factory.mktemp("photos")
    Image.fromarray(data.astronaut()).save(folder / "astronaut.png")
    Image.fromarray(data.coffee()).save(folder / "coffee.jpg")  # 400x600
    Image.fromarray(data.chelsea()).save(folder / "chelsea.jpg")  # 300x451
    (folder / "notes.txt").write_text("not an image")
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """kind -> (checkpoint path, the core model whose weights it holds). The framework files
    are written from the real adapters (their key names and pruning), their cores loaded
    from the pretraining model: detectron2's keeps every unit but no final norm (96 px
    table), mmseg's with out_indices (1, 2, 3) also drops the last block (128 px table)."""
    from srvit_backbones.detectron2.backbone import SRViTBackbone as Detectron2Backbone
    from srvit_backbones.mmseg import SRViTBackbone as MMSegBackbone

    tmp = tmp_path_factory.mktemp("checkpoints")
    model, ema = trained_like(0), trained_like(1)
    torch.save({"model": model.state_dict(), "model_ema": ema.state_dict(), "epoch": 3}, tmp / "last.pth")
    net = Detectron2Backbone("srvit_t_t2", img_size=96, **ARCH)
    load_pretrained(net.srvit, model.state_dict())
    detector = nn.ModuleDict({"backbone": nn.ModuleDict({"net": net}), "roi_heads": nn.Linear(4, 2)})
    torch.save({"model": detector.state_dict(), "iteration": 9}, tmp / "model_final.pth")
    backbone = MMSegBackbone("srvit_t_t2", img_size=128, out_indices=(1, 2, 3), **ARCH)
    load_pretrained(backbone.srvit, model.state_dict())
    assert len(backbone.srvit.units) == 4  # the last block was pruned: the checkpoint lacks it
    segmentor = nn.ModuleDict({"backbone": backbone, "decode_head": nn.Conv2d(64, 2, 1)})
    torch.save({"meta": {"iter": 10}, "state_dict": segmentor.state_dict()}, tmp / "iter_10.pth")
    return {"pretrain": (tmp / "last.pth", model), "pretrain_ema": (tmp / "last.pth", ema),
            "detectron2": (tmp / "model_final.pth", net.srvit.eval()),
            "mmseg": (tmp / "iter_10.pth", backbone.srvit.eval())}


def expected_mixture(model, path, size, keep_aspect):
    """The reference: the model's ``forward_feature_maps(return_mixture=True)`` on the image."""
    x = to_batch(load_image(path, size, keep_aspect, 16))
    with torch.no_grad():
        feats = model.forward_feature_maps(x, indices=list(UNITS), return_mixture=True)
    return {i: feats[f"mixture{i}"][0] for i in UNITS}


@pytest.mark.parametrize("kind,inputs,extra", [
    ("pretrain", "{folder}", []),
    ("pretrain_ema", "{folder}/coffee.jpg", ["--ema"]),
    ("detectron2", "{folder}/*.jpg", ["--keep-aspect"]),
    ("mmseg", "{folder}", ["--keep-aspect"]),
])
def test_pictures_show_the_checkpoints_router(kind, inputs, extra, photos, checkpoints, tmp_path):
    path, reference = checkpoints[kind]
    out = tmp_path / "out"
    result = tool.main([*SET, "--checkpoint", str(path), "--input", inputs.format(folder=photos), "--size", "64",
                        "--out-dir", str(out), *extra])
    names = {"{folder}": ["astronaut", "chelsea", "coffee"], "{folder}/*.jpg": ["chelsea", "coffee"],
             "{folder}/coffee.jpg": ["coffee"]}[inputs]
    assert [Path(r["path"]).stem for r in result["images"]] == names
    assert sorted(os.listdir(out)) == sorted([f"{n}_mixture.png" for n in names] + ["summary.png"])
    for png in os.listdir(out):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep_aspect = "--keep-aspect" in extra
    other = trained_like(5)  # a control: another model's maps differ
    for r in result["images"]:
        assert r["size"] == ((64, 96) if keep_aspect and Path(r["path"]).stem != "astronaut" else (64, 64))
        assert r["panels"] == [f"unit {i} (R{k}): {panel}" for i, k in UNITS.items()
                               for panel in ("argmax step", "entropy / log T", "weight per step")]
        want = expected_mixture(reference, r["path"], 64, keep_aspect)
        control = expected_mixture(other, r["path"], 64, keep_aspect)
        for i, s in r["units"].items():
            torch.testing.assert_close(s["weights"], want[i], rtol=0, atol=1e-6)
            assert (s["weights"] - control[i]).abs().max() > 0.05
            assert torch.equal(s["argmax"], want[i].argmax(0))
            torch.testing.assert_close(s["entropy"], torch.special.entr(want[i]).sum(0) / math.log(3))
            assert 0 <= s["entropy"].min() and s["entropy"].max() <= 1 and s["entropy"].std() > 0
            torch.testing.assert_close(s["mean_weight"], want[i].mean((1, 2)))
            torch.testing.assert_close(s["mean_weight"].sum(), torch.tensor(1.0))
            share = torch.tensor([(s["argmax"] == t).float().mean().item() for t in range(3)])
            torch.testing.assert_close(s["argmax_share"], share)
    tokens = [r["units"][1]["argmax"].numel() for r in result["images"]]
    for i, s in result["summary"].items():  # over every token of every image
        mean = sum(r["units"][i]["mean_weight"] * n for r, n in zip(result["images"], tokens)) / sum(tokens)
        torch.testing.assert_close(s["mean_weight"], mean)
        torch.testing.assert_close(s["mean_weight"].sum(), torch.tensor(1.0))
        torch.testing.assert_close(s["argmax_share"].sum(), torch.tensor(1.0))


def test_random_model_by_default_with_a_warning(tmp_path, capsys):
    result = tool.main([*SET, "--size", "64", "--out-dir", str(tmp_path)])
    assert "warning: no --checkpoint: a random model" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["astronaut_mixture.png", "summary.png"]
    weights = result["images"][0]["units"][1]["weights"]
    assert weights.shape == (3, 4, 4)
    torch.testing.assert_close(weights.sum(0), torch.ones(4, 4))
    assert weights.std() > 0  # the router is initialised non-zero: the steps get different weights


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16")
def test_amp_runs_bf16_and_stays_close(photos, checkpoints, tmp_path):
    path, _ = checkpoints["pretrain"]
    argv = [*SET, "--checkpoint", str(path), "--input", str(photos / "coffee.jpg"), "--size", "64"]
    fp32 = tool.main([*argv, "--out-dir", str(tmp_path / "fp32")])["images"][0]["units"]
    bf16 = tool.main([*argv, "--out-dir", str(tmp_path / "bf16"), "--amp"])["images"][0]["units"]
    diffs = [(bf16[i]["weights"] - fp32[i]["weights"]).abs().max().item() for i in UNITS]
    assert 0 < max(diffs) < 0.05, diffs  # bf16 ran (the maps moved), and by little
    assert os.path.exists(tmp_path / "bf16" / "coffee_mixture.png")


def test_amp_without_native_bf16_is_refused(monkeypatch, tmp_path):
    """A CPU without native bf16 (simulated: this one may have it) gets the reason, not a slow run."""
    import srvit_backbones.training.amp

    monkeypatch.setattr(srvit_backbones.training.amp, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(SystemExit, match="no native bf16.*run without --amp"):
        tool.main([*SET, "--size", "64", "--out-dir", str(tmp_path / "out"), "--amp"])
    assert not (tmp_path / "out").exists()


def test_checkpoint_of_another_variant_is_refused_with_the_reason(checkpoints, tmp_path):
    path, _ = checkpoints["mmseg"]
    argv = ["--model", "srvit_t_t2", "--set", "embed_dim=64", "num_heads=2", "num_steps=2"]
    with pytest.raises(SystemExit, match=r"recursion depth is T=\[3\], the model's T=2.*Use the variant"):
        tool.main([*argv, "--checkpoint", str(path), "--size", "64", "--out-dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,message", [
    (["--model", "srvit_deit_s", "--set", "embed_dim=64", "num_heads=2"], r"T=1, aggregation 'soft'\) has no router"),
    ([*SET, "aggregation=last"], r"aggregation 'last'\) has no router"),
    ([*SET, "--size", "70"], "--size 70 is not a multiple of the patch size 16: use 64 or 80"),
    ([*SET, "--size", "0"], "--size 0 is not a multiple of the patch size 16: use 16"),
    ([*SET, "--input", "{empty}"], "no images found in --input"),
    ([*SET, "--input", "{empty}/*.jpg"], "no images found in --input"),
    ([*SET, "--input", "{empty}/missing.jpg"], "missing.jpg' does not exist"),
    ([*SET, "--input", "{twins}"], r"several inputs are named \['a'\]"),
    ([*SET, "--checkpoint", "{empty}/missing.pth"], "checkpoint file not found"),
    ([*SET, "img_size=64"], r"\['img_size'\] cannot be set"),
])
def test_bad_requests_are_clear_errors(argv, message, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "twins").mkdir()
    for name in ("a.jpg", "a.png"):
        Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "twins" / name)
    argv = [a.format(empty=tmp_path / "empty", twins=tmp_path / "twins") for a in argv]
    with pytest.raises(SystemExit, match="^error: .*" + message):  # the tool's one line
        tool.main([*argv, "--out-dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_the_library_raises_typed_errors(tmp_path):
    """Called from Python, the pictures' model and the images raise the package's errors (the
    tool prints them); a notebook catches them."""
    from srvit_backbones.analysis.images import find_images
    from srvit_backbones.analysis.mixture_pictures import build_model, picture_names
    from srvit_backbones.errors import ConfigError, InputError

    with pytest.raises(ConfigError, match=r"^--size 70 is not a multiple of the patch size 16: use 64 or 80$"):
        build_model("srvit_t_t2", [("embed_dim", 64), ("num_heads", 2)], size=70)
    with pytest.raises(InputError, match=r"^--input '.*missing.jpg' does not exist"):
        find_images([str(tmp_path / "missing.jpg")])
    with pytest.raises(InputError, match=r"^several inputs are named \['a'\]"):
        picture_names(["x/a.jpg", "y/a.png"])
