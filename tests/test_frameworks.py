"""The framework table (``srvit_backbones.frameworks``): a config is told by its folder or text,
and a framework registered in the table is served by the tools without editing tools/ or models/."""
import glob
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

import srvit_backbones
from helpers import ROOT, load_tool
from srvit_backbones.analysis.demo import Demo, read_weights, refused_unless_it_fits, say_on_image
from srvit_backbones.analysis.flops_table import measure_variant
from srvit_backbones.checkpoint import require_fit
from srvit_backbones.frameworks import (
    FrameworkAdapter,
    adapter,
    framework_of,
    frameworks,
    register_framework,
    resolve,
    unregister_framework,
)

SHIPPED = sorted(p for folder in ("detectron2_configs", "mmdet_configs", "mmseg_configs")
                 for p in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)
                 if not {"_base_", "common"} & set(p.split(os.sep)))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_shipped_config_is_told_by_its_folder(path):
    assert framework_of(path) == os.path.relpath(path, ROOT).split("_configs")[0]


def test_a_saved_or_own_config_is_told_by_its_text(tmp_path):
    """What a run saves (detectron2's config.yaml, an mmengine work dir's config with its
    default_scope) and a config of one's own over a shipped one, without importing a framework."""
    seg = srvit_backbones.resolve_config("mmseg", "upernet_srvit_s.py")
    configs = {"config.yaml": ("train:\n  max_iter: 10\n", "detectron2"),
               "lazy.py": ("from detectron2.config import LazyCall as L\n", "detectron2"),
               "work_dir_det.py": ("default_scope = 'mmdet'\nmodel = dict(type='MaskRCNN')\n", "mmdet"),
               "work_dir_seg.py": ("default_scope = 'mmseg'\n# mmdet's heads\n", "mmseg"),
               "mine.py": (f"_base_ = [{seg!r}]\n", "mmseg"),
               "base_det.py": ("_base_ = ['mmdet::_base_/default_runtime.py']\n", "mmdet"),
               "neither.py": ("x = 1\n", None)}
    for name, (text, expected) in configs.items():
        (tmp_path / name).write_text(text)
        assert framework_of(str(tmp_path / name)) == expected, name
    from mmengine.config import Config  # the config a run saves in its work dir says its default_scope
    Config.fromfile(seg).dump(tmp_path / "saved.py")
    assert framework_of(str(tmp_path / "saved.py")) == "mmseg"


def test_resolve_names_the_choices(tmp_path):
    assert resolve("upernet_srvit_s.py") == ("mmseg", os.path.join(ROOT, "mmseg_configs", "upernet_srvit_s.py"))
    assert resolve("cascade/cascade_mask_rcnn_srvit_s_t3.py", "detectron2")[0] == "detectron2"
    with pytest.raises(FileNotFoundError, match="upernet_srvit_s.py"):
        resolve("no_such_config.py")
    with pytest.raises(ValueError, match="unknown framework 'mmpose': choose detectron2, mmdet, mmseg"):
        resolve("upernet_srvit_s.py", "mmpose")
    with pytest.raises(ValueError, match="'quickstart/mask_rcnn_srvit_tiny_cpu.py' is shipped for detectron2 and "
                                         "mmdet: pass --framework"):
        resolve("quickstart/mask_rcnn_srvit_tiny_cpu.py")
    assert resolve("quickstart/mask_rcnn_srvit_tiny_cpu.py", "mmdet")[0] == "mmdet"
    broken = tmp_path / "broken.py"
    broken.write_text("model = dict(\n")
    with pytest.raises(ValueError, match="cannot tell which framework .* pass --framework"):
        resolve(str(broken))


# ------------------------------------------------------------------ a fourth framework
class ClassifierDemo(Demo):
    """An SR-ViT classifier's top class written on the image; predictions.json holds each
    image's label and score; a score under the threshold is "nothing found"."""

    def __init__(self, cfg, weights, source, score_threshold, hint):
        self.model = srvit_backbones.create_srvit(cfg["model"], num_classes=len(cfg["classes"]),
                                                  img_size=cfg["img_size"]).eval()
        with refused_unless_it_fits(hint):
            require_fit(weights, self.model, source, cfg["model"])
        self.model.load_state_dict(weights)
        self.classes, self.size, self.score_threshold = cfg["classes"], cfg["img_size"], score_threshold

    def predict(self, path):
        image = np.asarray(Image.open(path).convert("RGB"))
        x = torch.from_numpy(np.asarray(Image.fromarray(image).resize((self.size, self.size)), np.float32) / 255)
        with torch.no_grad():
            score, label = self.model(x.permute(2, 0, 1)[None]).softmax(-1)[0].max(0)
        prediction = dict(label=self.classes[int(label)], score=float(score))
        return say_on_image(image, f"{prediction['label']} {prediction['score']:.2f}"), prediction

    def is_empty(self, prediction):
        return prediction["score"] <= self.score_threshold

    def empty_message(self):
        return f"no class scores above {self.score_threshold:g}"

    def records(self, prediction, image_id, file_name):
        return [dict(image_id=image_id, file_name=file_name, **prediction)]


class TimmClassification(FrameworkAdapter):
    """Plain timm image classification over the core, with its own config type: a JSON file
    ``{"timm_classifier": {"model": VARIANT, "img_size": S, "classes": [...]}}``; ``KEY=VALUE``
    overrides with JSON values."""

    checkpoint_hint = "give the state dict of this config's classifier (timm's train.py or tools/pretrain.py)"

    def load_config(self, path, opts=()):
        with open(path) as f:
            cfg = json.load(f)["timm_classifier"]
        for opt in opts:
            key, value = opt.split("=", 1)
            cfg[key] = json.loads(value)
        return cfg

    def build_demo(self, cfg, checkpoint, device="cpu", amp=False, score_threshold=0.5, opacity=0.5):
        _, weights = read_weights(checkpoint, "model", self.name, self.checkpoint_hint)
        return ClassifierDemo(cfg, weights, checkpoint, score_threshold, self.checkpoint_hint)

    def count_flops(self, path, counted, plain=False):
        cfg = self.load_config(path)
        row = measure_variant(cfg["model"], (cfg["img_size"],) * 2, len(cfg["classes"]), plain)
        return dict(row, model=os.path.basename(path))


def is_classifier_json(path, text):
    return path.endswith(".json") and '"timm_classifier"' in text


@pytest.fixture
def classifier_files(tmp_path):
    """A config of the fourth framework's type, a checkpoint of its model and two images."""
    config = tmp_path / "srvit_t_t2_shapes.json"
    config.write_text(json.dumps({"timm_classifier": dict(model="srvit_t_t2", img_size=32,
                                                          classes=["circle", "square", "triangle"])}))
    torch.manual_seed(0)
    model = srvit_backbones.create_srvit("srvit_t_t2", num_classes=3, img_size=32)
    torch.save({"model": model.state_dict()}, tmp_path / "classifier.pth")
    for i in range(2):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 48, 3), np.uint8)).save(
            tmp_path / f"image{i}.png")
    return config, model


@pytest.fixture
def timm_classification(classifier_files):
    """The fourth framework registered in the table for the test, and removed after it."""
    register_framework("timm_classification", "classification", TimmClassification, recognizes=is_classifier_json)
    try:
        yield classifier_files
    finally:
        unregister_framework("timm_classification")
    assert "timm_classification" not in frameworks()


def test_a_fourth_framework_is_served_by_the_tools(timm_classification, tmp_path, capsys):
    """Registered in the table, a classification adapter of its own config type is found by the
    config loader, draws with tools/demo.py and is counted by tools/count_flops.py: nothing under
    tools/ or models/ names it."""
    config, model = timm_classification
    name, cfg = srvit_backbones.load_config(str(config), opts=['img_size=32'])
    assert name == "timm_classification" and cfg["classes"][2] == "triangle"
    assert isinstance(adapter(name), TimmClassification) and adapter(name).task == "classification"

    load_tool("demo").main([str(config), "--checkpoint", str(tmp_path / "classifier.pth"), "--input",
                            str(tmp_path / "image0.png"), str(tmp_path / "image1.png"), "--output",
                            str(tmp_path / "demo"), "--save-raw", "--score-threshold", "0"])
    records = json.loads((tmp_path / "demo" / "predictions.json").read_text())
    x = torch.from_numpy(np.asarray(Image.open(tmp_path / "image1.png").resize((32, 32)), np.float32) / 255)
    with torch.no_grad():
        expected = model.eval()(x.permute(2, 0, 1)[None]).softmax(-1)[0]
    assert [r["file_name"] for r in records] == ["image0.png", "image1.png"]
    assert records[1]["label"] == cfg["classes"][int(expected.argmax())]
    assert records[1]["score"] == pytest.approx(float(expected.max()), rel=1e-5)
    drawn = np.asarray(Image.open(tmp_path / "demo" / "image1.png"))
    assert drawn.shape == (40, 48, 3) and (drawn[:3] == 0).all()  # the label written on a band across its top

    assert "predictions drawn on 2 images" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--framework timm_classification ships no configs: name them with --configs"):
        load_tool("count_flops").main(["--task", "classification", "--framework", "timm_classification"])
    rows = load_tool("count_flops").main(["--task", "classification", "--framework", "timm_classification",
                                          "--configs", str(config), "--json"])
    table2 = measure_variant("srvit_t_t2", (32, 32), 3)
    assert rows == [dict(table2, model=config.name)] and rows[0]["params_m"] == pytest.approx(
        sum(p.numel() for p in model.parameters()) / 1e6)
    assert json.loads(capsys.readouterr().out) == rows


def test_a_checkpoint_of_another_model_is_refused_with_the_adapters_fix(timm_classification, tmp_path):
    config, model = timm_classification
    other = srvit_backbones.create_srvit("srvit_t_t2", num_classes=5, img_size=32)
    torch.save({"model": other.state_dict()}, tmp_path / "other.pth")
    with pytest.raises(SystemExit, match=r"(?s)does not fit srvit_t_t2.*head.weight.*Fix: give the state dict"):
        load_tool("demo").main([str(config), "--checkpoint", str(tmp_path / "other.pth"), "--input",
                                str(tmp_path / "image0.png"), "--output", str(tmp_path / "demo")])
