"""An mmdet or mmseg config against its data: the datasets' files as ``srvit_backbones.data.check``
splits, and the model's class count against the datasets' classes (a head of another size fails
late, at its first validation or in a bare IndexError). The frameworks' dataset classes'
defaults come from their ``DATASETS`` registry."""
import inspect
import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from mmengine.config import Config

from ..data.check import CocoSplit, SegSplit, coco_categories, run_check
from ..errors import ConfigError
from .tools import config_dicts, datasets

DatasetDefaults = Callable[[str], Dict]


def defaults_from(registry) -> DatasetDefaults:
    """A function of a dataset type: its class's ``__init__`` defaults (``img_suffix``,
    ``reduce_zero_label``...) and its ``METAINFO`` classes as ``classes``."""
    def dataset_defaults(dataset_type: str) -> Dict:
        dataset_class = registry.get(dataset_type)
        if not dataset_class:
            return {"classes": ()}
        params = inspect.signature(dataset_class.__init__).parameters
        defaults = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
        return dict(defaults, classes=tuple(getattr(dataset_class, "METAINFO", {}).get("classes", ())))
    return dataset_defaults


def check_against_data(cfg: Config, loaders: Sequence[str], registry, fix: str, read_files: bool) -> None:
    """What the tools check before the Runner is built.

    Args:
        cfg: the mmengine config.
        loaders: the config keys of the dataloaders to check (``train_dataloader``...).
        registry: the framework's ``DATASETS`` registry (the dataset classes' defaults).
        fix: how the tool sizes the heads from the data (the error's fix).
        read_files: also read every file of the datasets (``srvit_backbones.data.check``).

    Raises:
        ConfigError: a ``num_classes`` or the datasets' classes do not agree.
        DataCheckError: the datasets' files have errors.
    """
    dataset_defaults = defaults_from(registry)
    check_num_classes(cfg, loaders, dataset_defaults, fix)
    if read_files:
        run_check(data_splits(cfg, loaders, dataset_defaults), "--skip-data-check")


def _innermost(dataset: dict, where: str):
    """The datasets that read files (those without a wrapped ``dataset`` / ``datasets``)."""
    for path, inner in datasets(dataset, where):
        if not isinstance(inner.get("dataset"), dict) and not inner.get("datasets"):
            yield path, inner


def _file_datasets(cfg: Config, loaders: Iterable[str]):
    for loader in loaders:
        if cfg.get(loader):
            for where, dataset in _innermost(cfg[loader].get("dataset"), loader + ".dataset"):
                if not dataset.get("backend_args"):  # files behind a storage backend: not ours to read
                    yield where, dataset


def dataset_classes(dataset: dict, dataset_defaults: DatasetDefaults) -> Sequence[str]:
    """The classes a dataset config trains on: its ``metainfo.classes``, else its class's."""
    metainfo = dataset.get("metainfo") or {}
    if metainfo.get("classes"):
        return tuple(metainfo["classes"])
    return dataset_defaults(dataset.get("type", ""))["classes"]


def data_splits(cfg: Config, loaders: Iterable[str], dataset_defaults: DatasetDefaults) -> List:
    """The files of the loaders' datasets: a ``SegSplit`` for a dataset with ``data_prefix``
    ``img_path`` + ``seg_map_path`` (mmseg), a ``CocoSplit`` for a JSON ``ann_file`` with
    ``data_prefix.img`` (mmdet); each pair of folders once."""
    splits, seen = [], set()
    for where, dataset in _file_datasets(cfg, loaders):
        root, prefix = dataset.get("data_root") or "", dataset.get("data_prefix") or {}
        ann_file = os.path.join(root, dataset["ann_file"]) if dataset.get("ann_file") else None
        if "seg_map_path" in prefix:
            defaults = dict(dataset_defaults(dataset.get("type", "")), **dataset)
            split = SegSplit(where, os.path.join(root, prefix.get("img_path", "")),
                             os.path.join(root, prefix["seg_map_path"]),
                             num_classes=len(dataset_classes(dataset, dataset_defaults)),
                             img_suffix=defaults.get("img_suffix", ".jpg"),
                             seg_map_suffix=defaults.get("seg_map_suffix", ".png"),
                             reduce_zero_label=bool(defaults.get("reduce_zero_label", False)),
                             ignore_index=int(defaults.get("ignore_index", 255)), split_file=ann_file)
            key = (split.image_dir, split.label_dir, split.split_file)
        elif ann_file and ann_file.endswith(".json") and "img" in prefix:
            split = CocoSplit(where, ann_file, os.path.join(root, prefix["img"]))
            key = (split.ann_file, split.image_dir)
        else:
            continue
        if key not in seen:
            seen.add(key)
            splits.append(split)
    return splits


def _num_classes(model):
    """(dict, key, config key) of every ``num_classes`` of the model's class-dependent heads (an
    RPN's single objectness class is not one)."""
    for where, node in config_dicts(model, "model"):
        if isinstance(node.get("num_classes"), int) and "rpn_head" not in where.split("."):
            yield node, "num_classes", f"{where}.num_classes"


def check_num_classes(cfg: Config, loaders: Iterable[str], dataset_defaults: DatasetDefaults,
                      fix: str) -> None:
    """Every ``num_classes`` of the model equals every dataset's class count, a COCO file's
    categories are all among the dataset's classes (mmdet drops the others' annotations silently)
    and the datasets share their classes; else a ``ConfigError`` naming both and ``fix``."""
    first: Optional[tuple] = None
    for where, dataset in _file_datasets(cfg, loaders):
        classes = dataset_classes(dataset, dataset_defaults)
        if not classes:
            continue
        ann_file = os.path.join(dataset.get("data_root") or "", dataset.get("ann_file") or "")
        # CocoDataset keeps the categories its classes name; LVIS datasets keep all of the file's
        by_name = not str(dataset.get("type", "")).startswith("LVIS")
        if by_name and ann_file.endswith(".json") and os.path.isfile(ann_file):
            unnamed = [c["name"] for c in coco_categories(ann_file) if c["name"] not in classes]
            if unnamed:
                raise ConfigError(
                    f"{where}: {ann_file} has categories that the dataset's classes do not name: "
                    f"{', '.join(unnamed[:5])}{', ...' if len(unnamed) > 5 else ''} ({len(classes)} classes: "
                    f"{_names(classes)}); their annotations would be dropped. Set {where}.metainfo.classes to "
                    f"the file's category names; {fix}")
        if first is None:
            first = (where, classes)
        elif tuple(classes) != tuple(first[1]):
            raise ConfigError(f"{where} has {len(classes)} classes ({_names(classes)}), {first[0]} "
                              f"{len(first[1])} ({_names(first[1])}): the datasets need the same classes")
        for node, name, key in _num_classes(cfg.model):
            if node[name] != len(classes):
                raise ConfigError(f"{key}={node[name]} but {where} has {len(classes)} classes ({_names(classes)}): "
                                  f"set {key}={len(classes)}; {fix}")


def _names(classes: Sequence[str]) -> str:
    return ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")


def set_num_classes(model: dict, num_classes: int) -> None:
    """Every class-dependent ``num_classes`` of a model config set to ``num_classes``, in place."""
    for node, name, _ in list(_num_classes(model)):
        node[name] = num_classes


def innermost_dataset(cfg: Config, loader: str) -> dict:
    """The dataset config of ``loader`` that reads the files (inside its wrappers); a
    ``ConfigError`` when it holds several."""
    found = list(_innermost(cfg[loader].get("dataset"), loader))
    if len(found) != 1:
        raise ConfigError(f"{loader} holds {len(found)} datasets: a custom dataset replaces a single one; "
                          f"edit the config instead")
    return found[0][1]
