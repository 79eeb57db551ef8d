"""A detectron2 config on your own COCO-format data (``NAME_train`` / ``NAME_val``, the head sized from
the file's categories), and the check that every ``num_classes`` equals the datasets' category count."""
import os
from typing import List, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from ..data.check import CocoSplit, coco_categories


def register_coco_split(name: str, json_file: str, image_root: str) -> str:
    """``register_coco_instances(name, {}, json_file, image_root)``, replacing another registration of ``name``."""
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    json_file, image_root = os.path.abspath(json_file), os.path.abspath(image_root)
    if name in DatasetCatalog.list():
        meta = MetadataCatalog.get(name)
        if (meta.get("json_file"), meta.get("image_root")) == (json_file, image_root):
            return name
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    if not os.path.isfile(json_file):
        raise ValueError(f"annotation file {json_file} does not exist: pass the COCO-format JSON of the split "
                         f"(what labelling tools export as 'COCO')")
    register_coco_instances(name, {}, json_file, image_root)
    return name


def use_coco_files(cfg, train: Sequence[str], val: Optional[Sequence[str]] = None, name: str = "custom"):
    """``cfg`` training on ``train = (json_file, image_root)`` and evaluating on ``val`` (default: ``train``):
    the splits registered, the loaders and evaluator pointed at them, ``model.roi_heads.num_classes`` set."""
    names = {"train": register_coco_split(f"{name}_train", *train),
             "test": register_coco_split(f"{name}_val", *(val or train))}
    for split, registered in names.items():
        cfg.dataloader[split].dataset.names = registered
    evaluator = cfg.dataloader.get("evaluator")
    if evaluator is not None and "dataset_name" in evaluator:
        evaluator.dataset_name = names["test"]
    cfg.model.roi_heads.num_classes = len(dataset_classes(names["train"]))
    return cfg


def dataset_classes(name: str) -> List[str]:
    """The class names of a registered dataset (its ``thing_classes``, else its file's categories)."""
    from detectron2.data import MetadataCatalog

    meta = MetadataCatalog.get(name)
    classes = meta.get("thing_classes")
    if classes is None and meta.get("json_file") and os.path.isfile(meta.json_file):
        classes = [c["name"] for c in coco_categories(meta.json_file)]
    return list(classes) if classes is not None else None


def dataset_names(cfg) -> List[Tuple[str, str]]:
    """(config key, dataset name) of the train and test loaders."""
    pairs = []
    for split in ("train", "test"):
        loader = cfg.dataloader.get(split)
        names = loader.dataset.get("names") if loader is not None and "dataset" in loader else None
        for name in [names] if isinstance(names, str) else list(names or []):
            pairs.append((f"dataloader.{split}.dataset.names", name))
    return pairs


def _num_classes_keys(node, path="model"):
    """(config key, value) of every ``num_classes`` under ``node``, interpolations resolved."""
    if OmegaConf.is_dict(node):
        for key in node.keys():
            if key == "num_classes":
                yield f"{path}.{key}", node[key]
            else:
                yield from _num_classes_keys(node[key], f"{path}.{key}")
    elif OmegaConf.is_list(node):
        for i, child in enumerate(node):
            yield from _num_classes_keys(child, f"{path}.{i}")


def check_num_classes(cfg) -> None:
    """Every ``num_classes`` of the model equals the category count of every registered dataset, and
    train and test share their classes: else a ``ValueError`` naming both numbers and the fix."""
    from detectron2.data import DatasetCatalog

    seen = {}
    for key, name in dataset_names(cfg):
        if name not in DatasetCatalog.list():
            continue
        classes = dataset_classes(name)
        if classes is None:
            continue
        for other_key, (other_name, other_classes) in seen.items():
            if other_classes != classes:
                raise ValueError(f"{key}={name!r} has {len(classes)} classes ({_names(classes)}), "
                                 f"{other_key}={other_name!r} {len(other_classes)} ({_names(other_classes)}): "
                                 f"train and test need the same categories (same ids and names in both files)")
        seen[key] = (name, classes)
        for model_key, value in _num_classes_keys(cfg.model):
            if isinstance(value, int) and value != len(classes):
                raise ValueError(f"{model_key}={value} but {key}={name!r} has {len(classes)} categories "
                                 f"({_names(classes)}): set {model_key}={len(classes)}, or with "
                                 f"--coco-train / --coco-val drop the override (the head is then sized from "
                                 f"the categories)")


def _names(classes: Sequence[str]) -> str:
    return ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")


def data_splits(cfg) -> List[CocoSplit]:
    """The config's datasets registered from a file, as ``CocoSplit``s for ``srvit_backbones.data.check``."""
    from detectron2.data import MetadataCatalog

    splits = []
    for key, name in dataset_names(cfg):
        meta = MetadataCatalog.get(name)
        if meta.get("json_file") and meta.get("image_root"):
            splits.append(CocoSplit(f"{key}={name!r}", meta.json_file, meta.image_root))
    return splits
