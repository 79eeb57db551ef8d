#!/usr/bin/env python
"""Draw a trained SR-ViT model's predictions on images: Mask R-CNN instances with detectron2's
``Visualizer`` or mmdet's ``DetLocalVisualizer``, segmentation maps with mmseg's
``SegLocalVisualizer``. It reads our LazyConfigs (detectron2's own demo/demo.py reads only yacs
configs), mmdet and mmseg configs, by path or by shipped name; the framework follows from the config.

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
import glob
import json
import os
import re

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

import srvit_backbones
from srvit_backbones.amp import amp_dtype, autocast
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


def refuse_unless_fits(checkpoint, framework, incorrect_shapes, missing, unexpected):
    """A SystemExit listing what of ``checkpoint`` does not fit the model (a few names of each
    kind), unless nothing: the frameworks' loaders only log a partial load."""
    shapes = [f"{k} {tuple(a)} vs {tuple(b)}" for k, a, b in incorrect_shapes]
    missing = [k for k in missing if k not in {k for k, _, _ in incorrect_shapes}]
    problems = [f"{what} ({len(keys)}): " + ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
                for what, keys in (("another shape, checkpoint vs model", shapes),
                                   ("missing from the checkpoint", missing), ("not in the model", unexpected)) if keys]
    if problems:
        raise SystemExit(f"--checkpoint {checkpoint} does not fit the {framework} config's model:\n  "
                         + "\n  ".join(problems) + f"\nFix: {FIX[framework]}")


class Detectron2Demo:
    """A LazyConfig detector with every weight of its checkpoint loaded, the test-time resize of
    its config and its dataset's metadata (class names, category ids)."""

    def __init__(self, config, checkpoint, device="cpu", amp=False, score_threshold=0.5, opts=()):
        from detectron2.checkpoint import DetectionCheckpointer
        from detectron2.config import LazyConfig, instantiate
        from detectron2.data import MetadataCatalog
        from detectron2.data import transforms as T

        cfg = LazyConfig.load(config)
        if "model" not in cfg:
            raise SystemExit(f"{config} is not a detectron2 LazyConfig (it has no 'model'; a yacs config?): the demo "
                             f"reads LazyConfigs, .py files or the config.yaml that tools/train_net.py saves")
        cfg = LazyConfig.apply_overrides(cfg, list(opts))
        cfg.model.roi_heads.box_predictor.test_score_thresh = score_threshold  # what the detector returns at all
        _, weights = read_weights(checkpoint, "model", "detectron2")
        self.model = instantiate(cfg.model).to(device).eval()
        # detectron2's checkpointer matches the weights; it only logs what does not fit
        bad = DetectionCheckpointer(self.model)._load_model({"model": weights})
        refuse_unless_fits(checkpoint, "detectron2", bad.incorrect_shapes, bad.missing_keys, bad.unexpected_keys)
        self.device, self.amp = device, amp
        self.augmentations = T.AugmentationList(instantiate(cfg.dataloader.test.mapper.augmentations))
        self.image_format = cfg.dataloader.test.mapper.image_format
        names = cfg.dataloader.test.dataset.names
        self.metadata = MetadataCatalog.get(names if isinstance(names, str) else names[0])

    @torch.no_grad()
    def predict(self, path):
        """(RGB image, Instances scoring above the threshold, in the image's pixels, float32 on the CPU)."""
        from detectron2.data import detection_utils
        from detectron2.data import transforms as T

        image = detection_utils.read_image(path, format=self.image_format)
        aug = T.AugInput(image)
        self.augmentations(aug)
        inputs = {"image": torch.as_tensor(np.ascontiguousarray(aug.image.transpose(2, 0, 1))).to(self.device),
                  "height": image.shape[0], "width": image.shape[1]}
        with autocast(self.device, self.amp):
            instances = self.model([inputs])[0]["instances"].to("cpu")
        for name, value in instances.get_fields().items():  # bf16/fp16 under --amp
            if torch.is_tensor(value) and value.is_floating_point():
                instances.set(name, value.float())
            elif hasattr(value, "tensor") and value.tensor.is_floating_point():
                value.tensor = value.tensor.float()
        return detection_utils.convert_image_to_rgb(image, self.image_format), instances

    def draw(self, image, instances):
        from detectron2.utils.visualizer import ColorMode, Visualizer

        return Visualizer(image, self.metadata, instance_mode=ColorMode.IMAGE) \
            .draw_instance_predictions(instances).get_image()

    def raw(self, instances, image_id, file_name):
        """COCO results (XYWH boxes, RLE masks) with the dataset's category ids."""
        from detectron2.evaluation.coco_evaluation import instances_to_coco_json

        to_dataset_id = {v: k for k, v in getattr(self.metadata, "thing_dataset_id_to_contiguous_id", {}).items()}
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


def load_openmmlab_checkpoint(model, checkpoint, framework):
    """Load every weight of an mmengine checkpoint into ``model`` or refuse, listing what does not
    fit (mmengine's loader only logs it); returns the checkpoint object."""
    from mmengine.runner.checkpoint import _load_checkpoint_to_model

    ckpt, weights = read_weights(checkpoint, "state_dict", framework)
    own = model.state_dict()
    weights = {re.sub(r"^module\.", "", k): v for k, v in weights.items()}  # as mmengine's loader
    shapes = [(k, v.shape, own[k].shape) for k, v in weights.items() if k in own and v.shape != own[k].shape]
    refuse_unless_fits(checkpoint, framework, shapes, [k for k in own if k not in weights],
                       [k for k in weights if k not in own])
    _load_checkpoint_to_model(model, ckpt, strict=True)
    return ckpt


class MMDetDemo:
    """An mmdet detector with its checkpoint loaded strictly, its dataset's classes and palette
    (from the checkpoint's meta, else from the config's test dataset) and category ids (from the
    test annotation file when it is there)."""

    def __init__(self, config, checkpoint, device="cpu", amp=False, score_threshold=0.5, opts=()):
        from mmdet.apis import init_detector
        from mmdet.registry import DATASETS
        from mmdet.visualization import DetLocalVisualizer

        import srvit_backbones.mmdet  # noqa: F401  (SRViT registered, mmengine checkpoints readable)

        cfg = openmmlab_config(config, opts)
        if (cfg.model.get("test_cfg") or {}).get("rcnn") is not None:
            cfg.model.test_cfg.rcnn.score_thr = score_threshold  # what the detector returns at all
        self.model = init_detector(cfg, None, device=device)
        ckpt = load_openmmlab_checkpoint(self.model, checkpoint, "mmdet")
        dataset = cfg.test_dataloader.dataset
        meta = (ckpt.get("meta") or {}).get("dataset_meta") or DATASETS.get(dataset.type).METAINFO
        self.model.dataset_meta = meta
        self.visualizer = DetLocalVisualizer(name=f"srvit_demo_{id(self)}")
        self.visualizer.dataset_meta = meta
        self.category_ids = self._category_ids(cfg, meta["classes"])
        self.device, self.amp, self.score_threshold = device, amp, score_threshold

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

    @torch.no_grad()
    def predict(self, path):
        """(RGB image, the InstanceData scoring above the threshold, float32 on the CPU)."""
        import mmcv
        from mmdet.apis import inference_detector

        with autocast(self.device, self.amp):
            instances = inference_detector(self.model, path).pred_instances.cpu()
        instances = instances[instances.scores > self.score_threshold]
        for name, value in instances.items():  # bf16/fp16 under --amp
            if torch.is_tensor(value) and value.is_floating_point():
                instances[name] = value.float()
        return mmcv.imread(path, channel_order="rgb"), instances

    def draw(self, image, instances):
        from mmdet.structures import DetDataSample

        self.visualizer.add_datasample("demo", image, DetDataSample(pred_instances=instances), draw_gt=False,
                                       show=False, pred_score_thr=0.0)
        return self.visualizer.get_image()

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
    """An mmseg segmentor with its checkpoint loaded strictly, and its dataset's classes and
    palette (from the checkpoint's meta, else from the config's test dataset)."""

    def __init__(self, config, checkpoint, device="cpu", amp=False, opacity=0.5, opts=()):
        from mmengine.model import revert_sync_batchnorm
        from mmseg.apis import init_model
        from mmseg.registry import DATASETS
        from mmseg.visualization import SegLocalVisualizer

        import srvit_backbones.mmseg  # noqa: F401  (SRViT registered, mmengine checkpoints readable)

        cfg = openmmlab_config(config, opts)
        self.model = init_model(cfg, None, device)
        if torch.device(device).type == "cpu":
            self.model = revert_sync_batchnorm(self.model)  # as mmseg's demo: SyncBN needs a GPU
        ckpt = load_openmmlab_checkpoint(self.model, checkpoint, "mmseg")
        meta = (ckpt.get("meta") or {}).get("dataset_meta") or DATASETS.get(cfg.test_dataloader.dataset.type).METAINFO
        self.visualizer = SegLocalVisualizer(name=f"srvit_demo_{id(self)}", alpha=opacity)
        self.visualizer.dataset_meta = dict(classes=meta["classes"], palette=meta["palette"])
        self.device, self.amp = device, amp

    @torch.no_grad()
    def predict(self, path):
        """(RGB image, class index of every pixel: an int64 HxW array)."""
        import mmcv
        from mmseg.apis import inference_model

        with autocast(self.device, self.amp):
            sample = inference_model(self.model, path)
        return mmcv.imread(path, channel_order="rgb"), sample.pred_sem_seg.data[0].cpu().numpy()

    def draw(self, image, labels):
        from mmengine.structures import PixelData
        from mmseg.structures import SegDataSample

        sample = SegDataSample(pred_sem_seg=PixelData(data=torch.from_numpy(labels)[None]))
        self.visualizer.add_datasample("demo", image, sample, draw_gt=False, draw_pred=True, show=False,
                                       out_file=None)
        return self.visualizer.get_image()


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
    drawn, raw, results = [], [], []
    for image_id, (path, name) in enumerate(tqdm(list(zip(paths, names)), desc="demo", unit="image")):
        image, prediction = demo.predict(path)
        png = os.path.splitext(name)[0] + ".png"
        out = os.path.join(args.output, png)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        Image.fromarray(demo.draw(image, prediction)).save(out)
        drawn.append(out)
        if args.save_raw and detection:
            results += demo.raw(prediction, image_id, name)
        elif args.save_raw:
            label_file = os.path.join(args.output, "labels", png)
            os.makedirs(os.path.dirname(label_file), exist_ok=True)
            Image.fromarray(prediction.astype(np.uint8 if prediction.max(initial=0) < 256 else np.uint16)) \
                .save(label_file)
            raw.append(label_file)
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
