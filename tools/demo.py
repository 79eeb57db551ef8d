#!/usr/bin/env python
"""Draw a trained SR-ViT model's predictions on images with each framework's own inference API:
detectron2's ``DefaultPredictor`` (for our LazyConfigs: detectron2's demo/demo.py reads only yacs
configs) and ``Visualizer``, mmdet's ``DetInferencer``, mmseg's ``MMSegInferencer``. It reads
LazyConfigs, mmdet and mmseg configs, by path or by shipped name; the framework follows from the
config. Added to them: the checkpoint must fit the model entirely (a ``LoadReport`` of what does
not, instead of a logged partial load), ``--save-raw`` and ``--amp`` (bf16 on a CPU with native bf16).

    python tools/demo.py detectron2_configs/quickstart/mask_rcnn_srvit_tiny_cpu.py \\
        --checkpoint output/quickstart_detectron2/model_final.pth --input datasets/coco/val2017 \\
        --output output/quickstart_detectron2/demo --save-raw
    python tools/demo.py upernet_srvit_s.py --checkpoint work_dirs/upernet_srvit_s/iter_160000.pth \\
        --input 'photos/*.jpg' --output demo/ --amp
    python tools/demo.py mask_rcnn_srvit_s_t3_lsj.py --checkpoint work_dirs/mask_rcnn_srvit_s_t3_lsj/iter_270000.pth \
        --input photos/ --output demo/ --save-raw
    python tools/demo.py output/my_run/config.yaml --checkpoint output/my_run/model_final.pth --input a.jpg \
        --output demo/ --score-threshold 0.3 --opts model.roi_heads.box_predictor.test_nms_thresh=0.3

Writes OUTPUT/NAME.png per image (NAME: the image's path below the inputs' common folder) and,
with --save-raw, OUTPUT/predictions.json (detection: COCO results, RLE masks, dataset category
ids) or OUTPUT/labels/NAME.png (segmentation: the class index of every pixel).
"""
import argparse
import contextlib
import glob
import json
import os
import re

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

import srvit_backbones
from srvit_backbones.amp import amp_dtype
from srvit_backbones.checkpoint import CheckpointError, read_checkpoint

# where a checkpoint that fits comes from
FIX = {"detectron2": "give the model_final.pth that tools/train_net.py wrote with this config and the same overrides "
                     "(a pretraining checkpoint holds only the backbone: train the detector first)",
       "mmseg": "give the iter_N.pth that tools/train_seg.py wrote with this config and the same options",
       "mmdet": "give the iter_N.pth that tools/train_det.py wrote with this config and the same options "
                "(a pretraining checkpoint holds only the backbone: train the detector first)"}
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
FRAMEWORKS = ("detectron2", "mmseg", "mmdet")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file, or the name of a shipped config (mask_rcnn_srvit_s_t3.py)")
    parser.add_argument("--checkpoint", required=True,
                        help="trained weights: tools/train_net.py's model_final.pth, tools/train_seg.py's or "
                             "tools/train_det.py's iter_N.pth")
    parser.add_argument("--input", nargs="+", required=True,
                        help="image files, folders (searched recursively) or globs")
    parser.add_argument("--output", required=True, help="folder for the drawn images (and raw predictions)")
    parser.add_argument("--framework", choices=FRAMEWORKS, help="default: inferred from the config")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true",
                        help="mixed precision: fp16 on CUDA, bf16 on a CPU with native bf16")
    parser.add_argument("--score-threshold", type=float, default=0.5, help="detection: draw and save the detections scoring above it")
    parser.add_argument("--opacity", type=float, default=0.5, help="segmentation: opacity of the drawn class colours")
    parser.add_argument("--save-raw", action="store_true",
                        help="also write predictions.json (detection) or labels/*.png (segmentation)")
    parser.add_argument("--opts", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides")
    return parser.parse_args(argv)


def resolve(config, framework=None):
    """(framework, path) of a config path or shipped name; the framework from the folder the
    config sits in, else from what the file imports, else from an mmengine config's default_scope."""
    frameworks = [framework] if framework else FRAMEWORKS
    for fw in frameworks:
        try:
            path = os.path.abspath(srvit_backbones.resolve_config(fw, config))
        except FileNotFoundError:
            continue
        if framework:
            return framework, path
        for fw_dir in FRAMEWORKS:
            root = srvit_backbones.config_dir(fw_dir)
            if os.path.commonpath([path, root]) == root:
                return fw_dir, path
        text = open(path, encoding="utf-8", errors="replace").read()
        if path.endswith((".yaml", ".yml")) or re.search(r"^\s*(from|import)\s+(detectron2|srvit_backbones\.detectron2)",
                                                         text, re.M):
            return "detectron2", path
        scope = _default_scope(path)
        if scope in ("mmseg", "mmdet"):
            return scope, path
        raise SystemExit(f"cannot tell whether {config!r} is a detectron2, mmseg or mmdet config: pass "
                         f"--framework detectron2, mmseg or mmdet")
    raise SystemExit(f"config {config!r} not found: neither a file nor a shipped config ("
                     + "; ".join(f"{fw}: {', '.join(srvit_backbones.list_configs(fw))}" for fw in frameworks) + ")")


def _default_scope(path):
    """An mmengine config's ``default_scope`` (``'mmdet'``, ``'mmseg'``), None for other files."""
    try:
        from mmengine.config import Config

        return Config.fromfile(path).get("default_scope")
    except Exception:  # not an mmengine config (or mmengine is not installed)
        return None


def find_images(inputs):
    """Sorted image paths from files, folders (recursively) and globs; a clear error when
    something named does not exist or nothing is an image."""
    found = []
    for item in inputs:
        if os.path.isdir(item):
            found += [os.path.join(d, f) for d, _, files in os.walk(item) for f in files
                      if f.lower().endswith(IMAGE_EXTENSIONS)]
        elif os.path.isfile(item):
            found.append(item)
        elif glob.has_magic(item):
            found += [p for p in glob.glob(item, recursive=True) if p.lower().endswith(IMAGE_EXTENSIONS)]
        else:
            raise SystemExit(f"--input {item!r} does not exist: give image files, folders of images or globs")
    found = sorted(set(os.path.abspath(p) for p in found))
    if not found:
        raise SystemExit(f"no images found in --input {' '.join(inputs)} (looked for files ending in "
                         f"{', '.join(IMAGE_EXTENSIONS)})")
    return found


def relative_names(paths):
    """Each image's path below the images' common folder; its output name is that, as .png."""
    root = os.path.commonpath([os.path.dirname(p) for p in paths])
    names = [os.path.relpath(p, root) for p in paths]
    seen = {}
    for path, name in zip(paths, names):
        out = os.path.splitext(name)[0] + ".png"
        if out in seen:
            raise SystemExit(f"{seen[out]} and {path} would both be drawn to {out}: give them separately")
        seen[out] = path
    return names


def read_weights(checkpoint, key, framework):
    """(checkpoint object, its weights under ``key``) through the package's safe reader, or a
    SystemExit that says why the file is not a ``framework`` checkpoint and where one comes from."""
    if not os.path.isfile(checkpoint):
        raise SystemExit(f"--checkpoint {checkpoint!r} does not exist: train one with tools/train_net.py "
                         f"(model_final.pth in train.output_dir), tools/train_seg.py or tools/train_det.py (iter_N.pth in the "
                         f"work dir)")
    try:
        obj = read_checkpoint(checkpoint)
    except CheckpointError as e:
        raise SystemExit(f"--checkpoint: {e}") from None
    weights = obj.get(key, obj) if isinstance(obj, dict) else obj
    if not (isinstance(weights, dict) and weights and all(torch.is_tensor(v) for v in weights.values())):
        held = ", ".join(map(str, list(obj)[:6])) if isinstance(obj, dict) else type(obj).__name__
        raise SystemExit(f"--checkpoint {checkpoint} holds no {framework} weights (nothing under {key!r}; it holds "
                         f"{held}). Fix: {FIX[framework]}")
    return obj, weights


@contextlib.contextmanager
def refused_unless_it_fits(framework):
    """A checkpoint that does not fit the model entirely (``require_fit``'s CheckpointError) as a
    SystemExit that says where one that fits comes from."""
    try:
        yield
    except CheckpointError as e:
        raise SystemExit(f"--checkpoint {e}\nFix: {FIX[framework]}") from None


class Detectron2Demo:
    """detectron2's ``DefaultPredictor`` (``srvit_backbones.detectron2.predictor``, for
    LazyConfigs) and ``Visualizer``, with its test dataset's metadata (class names, category ids)."""

    def __init__(self, config, checkpoint, device="cpu", amp=False, score_threshold=0.5, opts=()):
        from detectron2.config import LazyConfig

        from srvit_backbones.detectron2.predictor import LazyConfigPredictor

        cfg = LazyConfig.load(config)
        if "model" not in cfg:
            raise SystemExit(f"{config} is not a detectron2 LazyConfig (it has no 'model'; a yacs config?): the demo "
                             f"reads LazyConfigs, .py files or the config.yaml that tools/train_net.py saves")
        cfg = LazyConfig.apply_overrides(cfg, list(opts))
        cfg.model.roi_heads.box_predictor.test_score_thresh = score_threshold  # what the detector returns at all
        _, weights = read_weights(checkpoint, "model", "detectron2")
        with refused_unless_it_fits("detectron2"):
            self.predictor = LazyConfigPredictor(cfg, weights, device, amp, source=checkpoint)

    def predict(self, path):
        """(the image with its predictions drawn, the Instances scoring above the threshold, in
        the image's pixels)."""
        from detectron2.data import detection_utils
        from detectron2.utils.visualizer import ColorMode, Visualizer

        image = detection_utils.read_image(path, format="BGR")  # what DefaultPredictor takes
        instances = self.predictor(image)["instances"]
        drawn = Visualizer(image[:, :, ::-1], self.predictor.metadata, instance_mode=ColorMode.IMAGE) \
            .draw_instance_predictions(instances).get_image()
        return drawn, instances

    def raw(self, instances, image_id, file_name):
        """COCO results (XYWH boxes, RLE masks) with the dataset's category ids."""
        from detectron2.evaluation.coco_evaluation import instances_to_coco_json

        metadata = self.predictor.metadata
        to_dataset_id = {v: k for k, v in getattr(metadata, "thing_dataset_id_to_contiguous_id", {}).items()}
        results = instances_to_coco_json(instances, image_id)
        for r in results:
            r["category_id"] = to_dataset_id.get(r["category_id"], r["category_id"])
            r["file_name"] = file_name
        return results


def openmmlab_config(config, opts):
    """An mmengine config with ``--opts`` applied as mmseg's / mmdet's own ``--cfg-options``."""
    from mmengine.config import Config, DictAction

    cfg = Config.fromfile(config)
    if opts:
        ns = argparse.Namespace()
        DictAction(option_strings=["--opts"], dest="opts")(None, ns, list(opts))
        cfg.merge_from_dict(ns.opts)
    return cfg


class MMDetDemo:
    """mmdet's ``DetInferencer`` (``srvit_backbones.mmdet.inference``), which draws with
    ``DetLocalVisualizer``, and the category ids of the test annotation file when it is there."""

    def __init__(self, config, checkpoint, device="cpu", amp=False, score_threshold=0.5, opts=()):
        from srvit_backbones.mmdet.inference import SRViTDetInferencer

        cfg = openmmlab_config(config, opts)
        if (cfg.model.get("test_cfg") or {}).get("rcnn") is not None:
            cfg.model.test_cfg.rcnn.score_thr = score_threshold  # what the detector returns at all
        ckpt, _ = read_weights(checkpoint, "state_dict", "mmdet")
        with refused_unless_it_fits("mmdet"):
            self.inferencer = SRViTDetInferencer(cfg, ckpt, checkpoint, device=device, amp=amp)
        self.category_ids = self._category_ids(cfg, self.inferencer.model.dataset_meta["classes"])
        self.score_threshold = score_threshold

    @staticmethod
    def _category_ids(cfg, classes):
        """The dataset's category id of each label, from the COCO annotation file the config's
        test set names (as mmdet's CocoMetric maps them); label indices when there is none."""
        dataset = cfg.test_dataloader.dataset
        ann_file = os.path.join(dataset.get("data_root") or "", dataset.get("ann_file") or "")
        if not os.path.isfile(ann_file):
            print(f"note: {ann_file!r} does not exist: predictions.json gives label indices as category_id")
            return list(range(len(classes)))
        categories = {c["name"]: c["id"] for c in json.load(open(ann_file))["categories"]}
        return [categories.get(name, i) for i, name in enumerate(classes)]

    def predict(self, path):
        """(the image with its predictions drawn, the InstanceData scoring above the threshold)."""
        out = self.inferencer(path, return_vis=True, no_save_vis=True, pred_score_thr=self.score_threshold,
                              return_datasamples=True)
        instances = out["predictions"][0].pred_instances.cpu()
        return out["visualization"][0], instances[instances.scores > self.score_threshold]

    def raw(self, instances, image_id, file_name):
        """COCO results (XYWH boxes, RLE masks) with the dataset's category ids."""
        import pycocotools.mask as mask_util

        results = []
        for i in range(len(instances)):
            x0, y0, x1, y1 = instances.bboxes[i].tolist()
            result = dict(image_id=image_id, file_name=file_name, score=float(instances.scores[i]),
                          category_id=self.category_ids[int(instances.labels[i])], bbox=[x0, y0, x1 - x0, y1 - y0])
            if "masks" in instances:
                rle = mask_util.encode(np.asfortranarray(instances.masks[i].numpy().astype(np.uint8)))
                result["segmentation"] = dict(size=rle["size"], counts=rle["counts"].decode("ascii"))
            results.append(result)
        return results


class MMSegDemo:
    """mmseg's ``MMSegInferencer`` (``srvit_backbones.mmseg.inference``), which draws with
    ``SegLocalVisualizer``."""

    def __init__(self, config, checkpoint, device="cpu", amp=False, opacity=0.5, opts=()):
        from srvit_backbones.mmseg.inference import SRViTSegInferencer

        cfg = openmmlab_config(config, opts)
        ckpt, _ = read_weights(checkpoint, "state_dict", "mmseg")
        with refused_unless_it_fits("mmseg"):
            self.inferencer = SRViTSegInferencer(cfg, ckpt, checkpoint, device=device, amp=amp)
        self.opacity = opacity

    def predict(self, path):
        """(the image with its segmentation drawn, the class index of every pixel: an int64 HxW array)."""
        out = self.inferencer(path, return_vis=True, opacity=self.opacity)
        return out["visualization"], out["predictions"]


def nothing_above(threshold):
    """What a detection picture with nothing drawn on it says."""
    return f"no detection scores above {threshold:g}: lower --score-threshold to see weaker ones"


def say_on_image(image, text):
    """``image`` (an RGB array) with ``text`` written in white across its top on a black band,
    wrapped to the image's width."""
    from PIL import ImageDraw, ImageFont

    picture = Image.fromarray(image)
    draw = ImageDraw.Draw(picture)
    font = ImageFont.load_default(size=max(10, picture.width // 40))
    lines = [""]
    for word in text.split():
        candidate = f"{lines[-1]} {word}".strip()
        if lines[-1] and draw.textlength(candidate, font=font) > picture.width - 8:
            lines.append(word)
        else:
            lines[-1] = candidate
    text = "\n".join(lines)
    bottom = draw.multiline_textbbox((4, 4), text, font=font)[3]
    draw.rectangle((0, 0, picture.width, bottom + 4), fill=(0, 0, 0))
    draw.multiline_text((4, 4), text, fill=(255, 255, 255), font=font)
    return np.asarray(picture)


def build_demo(args):
    framework, config = resolve(args.config, args.framework)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}, but no CUDA GPU is visible: run with --device cpu")
    if args.amp:
        try:
            amp_dtype(args.device)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    if framework == "detectron2":
        return Detectron2Demo(config, args.checkpoint, args.device, args.amp, args.score_threshold, args.opts)
    if framework == "mmdet":
        return MMDetDemo(config, args.checkpoint, args.device, args.amp, args.score_threshold, args.opts)
    return MMSegDemo(config, args.checkpoint, args.device, args.amp, args.opacity, args.opts)


def run(args):
    """Draw (and save) the predictions of every input image; returns (drawn files, raw files)."""
    paths = find_images(args.input)
    names = relative_names(paths)
    demo = build_demo(args)
    detection = isinstance(demo, (Detectron2Demo, MMDetDemo))
    drawn, raw, results, empty = [], [], [], []
    for image_id, (path, name) in enumerate(tqdm(list(zip(paths, names)), desc="demo", unit="image")):
        drawn_image, prediction = demo.predict(path)
        if detection and len(prediction) == 0:  # a picture with nothing drawn says why
            drawn_image = say_on_image(drawn_image, nothing_above(args.score_threshold))
            empty.append(name)
        png = os.path.splitext(name)[0] + ".png"
        out = os.path.join(args.output, png)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        Image.fromarray(drawn_image).save(out)
        drawn.append(out)
        if args.save_raw and detection:
            results += demo.raw(prediction, image_id, name)
        elif args.save_raw:
            label_file = os.path.join(args.output, "labels", png)
            os.makedirs(os.path.dirname(label_file), exist_ok=True)
            Image.fromarray(prediction.astype(np.uint8 if prediction.max(initial=0) < 256 else np.uint16)) \
                .save(label_file)
            raw.append(label_file)
    if empty:
        print(f"{len(empty)} of {len(paths)} images: {nothing_above(args.score_threshold)} ({', '.join(empty[:5])}"
              f"{', ...' if len(empty) > 5 else ''})")
    if args.save_raw and detection:
        raw.append(os.path.join(args.output, "predictions.json"))
        with open(raw[0], "w") as f:
            json.dump(results, f)
    return drawn, raw


def main(argv=None):
    args = parse_args(argv)
    drawn, raw = run(args)
    print(f"predictions drawn on {len(drawn)} images: {os.path.join(args.output, '')}")
    if raw:
        print(f"raw predictions: {raw[0] if len(raw) == 1 else os.path.join(args.output, 'labels', '')}")


if __name__ == "__main__":
    main()
