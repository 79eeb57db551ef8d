"""tools/demo.py end to end: the detectron2 and mmseg quickstarts trained a few iterations
through the real tools, then their predictions drawn, saved raw and checked against the images."""
import json
import os

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from PIL import Image
from pycocotools import mask as mask_util

import srvit_backbones.mmseg  # noqa: F401  (torch.load reads mmengine checkpoints)
from helpers import D2_QUICKSTART, ROOT, SEG_QUICKSTART, TEST_SIZE, load_tool, run, trained_detectron2, trained_mmseg
from srvit_backbones import create_srvit
from srvit_backbones.analysis.demo import say_on_image
from srvit_backbones.analysis.images import find_images
from srvit_backbones.detectron2 import add_srvit_config
from srvit_backbones.frameworks import adapter
from srvit_backbones.training.amp import cpu_has_native_bf16

LOW = 0.001  # a few-iteration detector scores low: draw (almost) everything it returns


@pytest.fixture(scope="session")
def d2_run(tmp_path_factory):
    return trained_detectron2(tmp_path_factory)


@pytest.fixture(scope="session")
def seg_run(tmp_path_factory):
    return trained_mmseg(tmp_path_factory)


def rgb(path):
    return np.asarray(Image.open(path).convert("RGB"))


def d2_val_images(d2_run):
    folder = d2_run / "data" / "coco" / "val2017"
    return folder, sorted(os.listdir(folder))


def d2_demo(d2_run, **kwargs):
    """The detectron2 quickstart's demo at the run's size, as tools/demo.py builds it."""
    cfg = adapter("detectron2").load_config(D2_QUICKSTART, TEST_SIZE)
    return adapter("detectron2").build_demo(cfg, str(d2_run / "out" / "model_final.pth"), **kwargs)


def seg_demo(checkpoint, **kwargs):
    return adapter("mmseg").build_demo(adapter("mmseg").load_config(SEG_QUICKSTART), str(checkpoint), **kwargs)


def test_detectron2_demo_draws_and_saves_coco_results(d2_run, tmp_path):
    """The demo as a user runs it, on the run's saved config: one drawing per image, COCO
    results whose masks decode to the image's size, and drawn pixels inside every predicted mask."""
    folder, names = d2_val_images(d2_run)
    out = tmp_path / "demo"
    proc, log = run(tmp_path, os.path.join(ROOT, "tools", "demo.py"), str(d2_run / "out" / "config.yaml"),
                    "--checkpoint", str(d2_run / "out" / "model_final.pth"), "--input", str(folder),
                    "--output", str(out), "--score-threshold", str(LOW), "--save-raw")
    assert proc.returncode == 0, log[-3000:]
    assert sorted(os.listdir(out)) == sorted([n.replace(".jpg", ".png") for n in names] + ["predictions.json"])

    results = json.load(open(out / "predictions.json"))
    assert results, "a low threshold must leave predictions"
    coco_ids = {c["id"] for c in json.load(open(d2_run / "data" / "coco" / "annotations" / "instances_val2017.json"))
                ["categories"]}
    for image_id, name in enumerate(names):
        image = rgb(folder / name)
        drawn = rgb(out / name.replace(".jpg", ".png"))
        assert drawn.shape == image.shape
        mine = [r for r in results if r["image_id"] == image_id]
        assert mine and {r["file_name"] for r in mine} == {name}
        h, w = image.shape[:2]
        union = np.zeros((h, w), dtype=bool)
        for r in mine:
            assert r["category_id"] in coco_ids and LOW < r["score"] <= 1
            x, y, bw, bh = r["bbox"]
            assert -1 <= x and -1 <= y and x + bw <= w + 1 and y + bh <= h + 1
            assert r["segmentation"]["size"] == [h, w]
            union |= mask_util.decode(r["segmentation"]).astype(bool)
        changed = (drawn != image).any(-1)
        assert union.any() and changed[union].mean() > 0.5, (name, changed[union].mean())


def test_mmseg_demo_draws_the_label_map_it_saves(seg_run, tmp_path):
    """On the run's own dumped config (framework found from its text): a label PNG of the
    image's size per image, and the drawing is mmseg's blend of the image with the palette
    colour of exactly those labels, but where class names are written (a few-iteration model
    predicts many small regions, each named)."""
    from mmseg.datasets import ADE20KDataset

    folder = seg_run / "datasets" / "ade" / "ADEChallengeData2016" / "images" / "validation"
    out = tmp_path / "demo"
    load_tool("demo").main([str(seg_run / "work" / "upernet_srvit_tiny_cpu.py"), "--checkpoint",
                      str(seg_run / "work" / "iter_4.pth"), "--input", str(folder / "*.jpg"), "--output", str(out),
                      "--save-raw", "--opacity", "0.5"])
    names = sorted(os.listdir(folder))
    assert sorted(os.listdir(out)) == sorted([n.replace(".jpg", ".png") for n in names] + ["labels"])
    palette = np.array(ADE20KDataset.METAINFO["palette"])
    for name in names:
        image = rgb(folder / name)
        labels = np.asarray(Image.open(out / "labels" / name.replace(".jpg", ".png")))
        assert labels.shape == image.shape[:2] and labels.dtype == np.uint8 and labels.max() < 150
        drawn = rgb(out / name.replace(".jpg", ".png"))
        blended = (drawn == (image * 0.5 + palette[labels] * 0.5).astype(np.uint8)).all(-1)
        assert blended.mean() > 0.75
        for label in np.unique(labels):
            if (labels == label).mean() > 0.05:  # large regions: their name covers a small part
                assert blended[labels == label].mean() > 0.5, label
        assert (drawn != image).any(-1).mean() > 0.9


def test_score_threshold_is_the_lowest_score_returned(d2_run):
    """--score-threshold sets the detector's own test threshold: raised to the median score of
    what a LOW threshold returns, exactly the detections scoring above it remain."""
    folder, names = d2_val_images(d2_run)
    scores = {}
    for threshold in (LOW, "median"):
        if threshold == "median":
            threshold = float(scores[LOW].median())
        detector = d2_demo(d2_run, score_threshold=threshold)
        scores[threshold] = detector.predict(str(folder / names[0]))[1].scores
        assert len(scores[threshold]) and (scores[threshold] > threshold).all()
    low, median = scores.values()
    assert torch.equal(median, low[low > low.median()])


def test_a_picture_with_nothing_above_the_threshold_says_so(d2_run, tmp_path, capsys):
    """At a threshold no detection passes (scores are at most 1), the picture is the image with
    the reason written across its top, in white on black, and the tool names the images; one
    with detections carries no such band."""
    folder, names = d2_val_images(d2_run)
    image = rgb(folder / names[0])
    for threshold, out in ((1.0, tmp_path / "none"), (LOW, tmp_path / "low")):
        load_tool("demo").main([D2_QUICKSTART, "--checkpoint", str(d2_run / "out" / "model_final.pth"), "--input",
                                str(folder / names[0]), "--output", str(out), "--score-threshold", str(threshold),
                                "--opts", *TEST_SIZE])
    message = "no detection scores above 1: lower --score-threshold to see weaker ones"
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"1 of 1 images: {message} ({names[0]})"
    assert not any("images: no detection" in line for line in printed[1:])  # the LOW run drew something
    picture = rgb(tmp_path / "none" / names[0].replace(".jpg", ".png"))
    assert np.array_equal(picture, say_on_image(image, message))
    band = (picture != image).any(-1).any(-1).nonzero()[0]
    assert band[0] == 0 and 10 < band[-1] + 1 < image.shape[0] // 2  # a few lines at the top, the rest untouched
    assert np.array_equal(picture[band[-1] + 1:], image[band[-1] + 1:])
    assert (picture[band] > 200).all(-1).sum() > 50 and (picture[band] == 0).all(-1).mean() > 0.5  # white on black
    drawn = rgb(tmp_path / "low" / names[0].replace(".jpg", ".png"))
    assert not (drawn[:band[-1] + 1] == 0).all(-1).mean() > 0.5


def test_lazyconfig_predictor_predicts_as_the_evaluation_does(d2_run):
    """srvit_backbones.detectron2's DefaultPredictor for LazyConfigs, on a BGR image, returns what
    the model returns on the config's test DatasetMapper output (what tools/train_net.py
    evaluates), with the test dataset's metadata."""
    from detectron2.config import LazyConfig, instantiate
    from detectron2.data import detection_utils

    from srvit_backbones.detectron2.predictor import LazyConfigPredictor

    folder, names = d2_val_images(d2_run)
    cfg = LazyConfig.apply_overrides(LazyConfig.load(D2_QUICKSTART), TEST_SIZE)
    cfg.model.roi_heads.box_predictor.test_score_thresh = LOW
    weights = torch.load(d2_run / "out" / "model_final.pth", map_location="cpu", weights_only=True)["model"]
    predictor = LazyConfigPredictor(cfg, weights)
    assert predictor.metadata.name == "coco_2017_val"
    path = str(folder / names[0])
    ours = predictor(detection_utils.read_image(path, format="BGR"))["instances"]
    image = detection_utils.read_image(path, format="RGB")
    sample = instantiate(cfg.dataloader.test.mapper)(dict(file_name=path, height=image.shape[0],
                                                          width=image.shape[1], image_id=0))
    with torch.no_grad():
        theirs = predictor.model([sample])[0]["instances"]
    assert len(ours) > 0 and torch.equal(ours.scores, theirs.scores)
    assert torch.equal(ours.pred_boxes.tensor, theirs.pred_boxes.tensor)
    assert torch.equal(ours.pred_masks, theirs.pred_masks)


def test_segmentor_checkpoint_without_dataset_meta_takes_the_configs_classes(seg_run, tmp_path):
    """A checkpoint with weights only (no mmengine meta) is drawn with the classes and palette of
    the config's test dataset, not mmseg's Cityscapes default."""
    from mmseg.datasets import ADE20KDataset

    saved = torch.load(seg_run / "work" / "iter_4.pth", map_location="cpu", weights_only=True)
    assert saved["meta"]["dataset_meta"]["classes"] == ADE20KDataset.METAINFO["classes"]
    torch.save({"state_dict": saved["state_dict"]}, tmp_path / "weights.pth")
    segmentor = seg_demo(tmp_path / "weights.pth")
    ade20k = {k: ADE20KDataset.METAINFO[k] for k in ("classes", "palette")}
    assert segmentor.inferencer.model.dataset_meta == ade20k
    segmentor.predict(str(next((seg_run / "datasets" / "ade" / "ADEChallengeData2016" / "images" / "validation")
                               .iterdir())))
    assert segmentor.inferencer.visualizer.dataset_meta == ade20k  # what MMSegInferencer draws with


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16 (AVX512-BF16 or AMX)")
def test_amp_on_the_cpu_runs_bf16(d2_run, seg_run):
    """--amp: the backbones' matrix products run in bf16; what the demo returns is float32 and drawable."""
    folder, names = d2_val_images(d2_run)
    dtypes = []

    def record(module, inputs, output):
        dtypes.append(output.dtype)

    detector = d2_demo(d2_run, amp=True, score_threshold=LOW)
    detector.predictor.model.backbone.net.srvit.units[1].blocks[0].attn.qkv.register_forward_hook(record)
    drawn, instances = detector.predict(str(folder / names[0]))
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert len(instances) and instances.scores.dtype == instances.pred_boxes.tensor.dtype == torch.float32
    assert drawn.shape == rgb(folder / names[0]).shape

    dtypes.clear()
    segmentor = seg_demo(seg_run / "work" / "iter_4.pth", amp=True)
    segmentor.inferencer.model.backbone.srvit.units[1].blocks[0].attn.qkv.register_forward_hook(record)
    path = next((seg_run / "datasets" / "ade" / "ADEChallengeData2016" / "images" / "validation").iterdir())
    drawn, labels = segmentor.predict(str(path))
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert labels.shape == drawn.shape[:2] == rgb(path).shape[:2]


def test_amp_without_native_bf16_is_explained(d2_run, tmp_path, monkeypatch):
    import srvit_backbones.training.amp

    monkeypatch.setattr(srvit_backbones.training.amp, "cpu_has_native_bf16", lambda: False)
    folder, _ = d2_val_images(d2_run)
    with pytest.raises(SystemExit, match="no native bf16.*run without --amp"):
        load_tool("demo").main([D2_QUICKSTART, "--checkpoint", str(d2_run / "out" / "model_final.pth"), "--input",
                          str(folder), "--output", str(tmp_path), "--device", "cpu", "--amp"])


def bad_inputs(d2_run, seg_run, tmp_path):
    d2_ckpt, seg_ckpt = str(d2_run / "out" / "model_final.pth"), str(seg_run / "work" / "iter_4.pth")
    images = str(d2_val_images(d2_run)[0])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not an image")
    (tmp_path / "neither.py").write_text("x = 1\n")
    pretrained = str(tmp_path / "pretrained.pth")  # what tools/pretrain.py writes: a backbone only
    torch.save({"model": create_srvit("srvit_t_t2", img_size=128, embed_dim=64, num_heads=2).state_dict()},
               pretrained)
    cfg = get_cfg()
    add_srvit_config(cfg)
    (tmp_path / "yacs.yaml").write_text(cfg.dump())
    out = ["--output", str(tmp_path / "out")]
    seg = ["quickstart/upernet_srvit_tiny_cpu.py", "--input", images, *out]
    return {
        "missing checkpoint": ([D2_QUICKSTART, "--checkpoint", "missing.pth", "--input", images, *out],
                               "'missing.pth' does not exist. Fix: give the model_final.pth that "
                               "tools/train_net.py wrote"),
        "not a checkpoint": ([D2_QUICKSTART, "--checkpoint", str(tmp_path / "neither.py"), "--input", images, *out],
                             "neither.py is not a PyTorch checkpoint"),
        "no images": ([D2_QUICKSTART, "--checkpoint", d2_ckpt, "--input", str(tmp_path / "empty"), *out],
                      "no images found in --input"),
        "missing input": ([D2_QUICKSTART, "--checkpoint", d2_ckpt, "--input", "nowhere/", *out],
                          "--input 'nowhere/' does not exist"),
        # trained at 128 pixels, the shipped config is 192: another position table
        "detector of another size": ([D2_QUICKSTART, "--checkpoint", d2_ckpt, "--input", images, *out],
                                     r"does not fit the detectron2 config's model:\n  another shape, checkpoint vs "
                                     r"model \(1\): backbone.net.srvit.pos_embed \(1, 65, 64\) vs \(1, 145, 64\)\n"
                                     r"Fix: give the model_final.pth"),
        "pretraining checkpoint for a detector": (
            [D2_QUICKSTART, "--checkpoint", pretrained, "--input", images, *out],
            r"(?s)does not fit the detectron2 config's model:\n  missing from the checkpoint \(\d+\): .*\n  not in "
            r"the model \(\d+\): .*pos_embed.*a pretraining checkpoint holds only the backbone"),
        "detector checkpoint for a segmentor": (
            [*seg, "--checkpoint", d2_ckpt], r"holds no mmseg weights \(nothing under 'state_dict'; it holds model, "
                                             r"trainer, iteration\)\. Fix: give the iter_N.pth"),
        "segmentor of another width": ([*seg, "--checkpoint", seg_ckpt, "--opts", "model.decode_head.channels=16"],
                                       r"does not fit the mmseg config's model:\n  another shape, checkpoint vs "
                                       r"model \(\d+\): decode_head.*\(32, 64, 1, 1\) vs \(16, 64, 1, 1\)"),
        "unknown config": (["mask_rcnn_srvit_q.py", "--checkpoint", d2_ckpt, "--input", images, *out],
                           "config 'mask_rcnn_srvit_q.py' not found: neither a file nor a shipped config"),
        "yacs config": ([str(tmp_path / "yacs.yaml"), "--checkpoint", d2_ckpt, "--input", images, *out],
                        r"yacs.yaml is not a detectron2 LazyConfig \(it has no 'model'; a yacs config\?\)"),
        "config of neither framework": ([str(tmp_path / "neither.py"), "--checkpoint", d2_ckpt, "--input", images,
                                         *out], r"cannot tell which framework .* is for \(detectron2, mmdet, "
                                                r"mmseg\): pass --framework"),
    }


CASES = ["missing checkpoint", "not a checkpoint", "no images", "missing input", "detector of another size",
         "pretraining checkpoint for a detector", "detector checkpoint for a segmentor", "segmentor of another width",
         "unknown config", "yacs config", "config of neither framework"]


def test_inputs_are_found_as_each_tool_documents(tmp_path, monkeypatch):
    """srvit_backbones.analysis.images.find_images: the demo searches folders recursively, visualize_mixture
    and merge_fidelity (recursive=False) take a folder's own images; a file named is taken as it
    is, a glob keeps the images it matches (any depth with **); sorted absolute paths, each once."""
    for name in ("b.jpg", "a.PNG", "notes.txt", "sub/c.jpeg", "sub/deeper/d.webp", "sub/e.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    top = [str(tmp_path / n) for n in ("a.PNG", "b.jpg")]
    every = top + [str(tmp_path / n) for n in ("sub/c.jpeg", "sub/deeper/d.webp")]
    assert find_images(["."]) == every
    assert find_images(["."], recursive=False) == top
    assert find_images(["**/*", "b.jpg", "notes.txt"]) == sorted(every + [str(tmp_path / "notes.txt")])
    assert find_images(["sub/*"], recursive=False) == [str(tmp_path / "sub" / "c.jpeg")]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_explained(d2_run, seg_run, tmp_path, case):
    argv, message = bad_inputs(d2_run, seg_run, tmp_path)[case]
    with pytest.raises(SystemExit, match=message):
        load_tool("demo").main(argv)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_without_a_gpu_is_explained(d2_run, tmp_path):
    with pytest.raises(SystemExit, match="--device cuda, but no CUDA GPU is visible: run with --device cpu"):
        load_tool("demo").main([D2_QUICKSTART, "--checkpoint", str(d2_run / "out" / "model_final.pth"), "--input",
                          str(d2_val_images(d2_run)[0]), "--output", str(tmp_path), "--device", "cuda"])


def test_the_score_threshold_reaches_every_box_predictor():
    """The demo's --score-threshold is what the detector returns at all: Mask R-CNN's one box
    predictor, each of a cascade's three."""
    from srvit_backbones.detectron2.demo import set_score_threshold

    _, mask_rcnn = srvit_backbones.load_config("mask_rcnn_srvit_s_t3.py", "detectron2")
    _, cascade = srvit_backbones.load_config("cascade/cascade_mask_rcnn_srvit_s_t3.py", "detectron2")
    set_score_threshold(mask_rcnn, 0.3)
    set_score_threshold(cascade, 0.3)
    assert mask_rcnn.model.roi_heads.box_predictor.test_score_thresh == 0.3
    assert [p.test_score_thresh for p in cascade.model.roi_heads.box_predictors] == [0.3] * 3
