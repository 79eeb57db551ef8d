"""mmdet's side of tools/train_det.py and tools/test_det.py (``openmmlab.entry``): mmdet's own script
options, your own COCO-format dataset, and what a missing COCO looks like."""
import os

from mmengine.config import Config

from ..data.check import add_coco_arguments, add_skip_argument, coco_categories
from ..errors import ConfigError, InputError
from ..openmmlab import data_check as openmmlab_data_check
from ..openmmlab import tools as openmmlab_tools
from ..openmmlab.entry import ScriptOptions, add_amp_argument

#: how the tools size the head from the data
SIZED_FROM_DATA = "or train with --coco-train / --coco-val, which size the heads from the file's categories"


class MMDetScriptOptions(ScriptOptions):
    """mmdet's tools/train.py and test.py: ``--auto-scale-lr``, ``--resume [CKPT]``, ``--out`` a pickle."""

    train_description = "Train a detector"
    test_description = "MMDet test (and eval) a model"
    out_help = "dump the predictions to this pickle file (mmdet's DumpDetResults)"
    show_dir_help = "directory, below the run's folder, where painted images will be saved"

    def add_train_arguments(self, parser):
        add_amp_argument(parser)
        parser.add_argument("--auto-scale-lr", action="store_true", help="scale the lr by the total batch size")
        parser.add_argument("--resume", nargs="?", type=str, const="auto",
                            help="resume from this checkpoint, or without a path from the latest one in the work dir")

    def apply_train_arguments(self, cfg, args):
        if args.auto_scale_lr:
            if "auto_scale_lr" not in cfg or "base_batch_size" not in cfg.auto_scale_lr:
                raise ConfigError("--auto-scale-lr needs auto_scale_lr=dict(base_batch_size=...) in the config")
            cfg.auto_scale_lr.enable = True
        if args.resume == "auto":
            cfg.resume, cfg.load_from = True, None
        elif args.resume is not None:
            cfg.resume, cfg.load_from = True, args.resume

    def check_test_arguments(self, args):
        if args.out is not None and not args.out.endswith((".pkl", ".pickle")):
            raise ConfigError(f"--out {args.out!r}: the dump is a pickle file, give a name ending in .pkl")

    def apply_test_arguments(self, cfg, args):
        if args.show_dir:
            cfg.default_hooks.visualization.update(draw=True, test_out_dir=args.show_dir)
        if args.out is not None:
            cfg.test_evaluator = [*(cfg.test_evaluator if isinstance(cfg.test_evaluator, list)
                                    else [cfg.test_evaluator]), dict(type="DumpDetResults", out_file_path=args.out)]


SCRIPT_OPTIONS = MMDetScriptOptions()


def add_data_arguments(parser) -> None:
    """The training tool's options for your own data and the one that skips the data check."""
    add_coco_arguments(parser)
    add_skip_argument(parser)


def load_config(args) -> Config:
    return openmmlab_tools.load_config(
        args, "mmdet", lambda cfg: use_coco_files(cfg, getattr(args, "coco_train", None),
                                                  getattr(args, "coco_val", None)))


def use_coco_files(cfg: Config, train, val=None) -> None:
    """``cfg`` on your own COCO-format data, in place: ``train`` / ``val`` = (json_file, image folder), the
    classes and the heads' ``num_classes`` from the file's categories.

    Raises:
        ConfigError: ``val`` without ``train``. InputError: an annotation file that does not exist.
    """
    if not train:
        if val:
            raise ConfigError("--coco-val needs --coco-train (the training split sizes the heads)")
        return
    val = val or train
    for ann_file, _ in (train, val):
        if not os.path.isfile(ann_file):
            raise InputError(f"annotation file {ann_file} does not exist: pass the COCO-format JSON of the split")
    classes = tuple(c["name"] for c in coco_categories(train[0]))
    for loader, (ann_file, images) in (("train_dataloader", train), ("val_dataloader", val),
                                       ("test_dataloader", val)):
        if cfg.get(loader):
            openmmlab_data_check.innermost_dataset(cfg, loader).update(
                data_root="", ann_file=os.path.abspath(ann_file),
                data_prefix=dict(img=os.path.join(os.path.abspath(images), "")), metainfo=dict(classes=classes))
    for name in ("val_evaluator", "test_evaluator"):
        for _, metric in _evaluators(cfg.get(name), name):
            if "ann_file" in metric:
                metric["ann_file"] = os.path.abspath(val[0])
    openmmlab_data_check.set_num_classes(cfg.model, len(classes))


def check_data(cfg: Config, loaders, read_files: bool = False) -> None:
    """The datasets' paths, LVIS files, class counts and, with ``read_files``, every image and annotation."""
    openmmlab_tools.check_data(cfg, loaders, _missing_data_message)
    check_lvis_data(cfg, loaders)
    from mmdet.registry import DATASETS

    openmmlab_data_check.check_against_data(cfg, loaders, DATASETS, SIZED_FROM_DATA, read_files)


def check_lvis_data(cfg: Config, loaders) -> None:
    """LVIS datasets' and metrics' files must be LVIS-format, and federated losses must find their image
    counts: an ``LVISFormatError`` naming the field and the fix otherwise."""
    from ..data.lvis import LVIS_V1, LVISFormatError, check_lvis_annotations, class_image_counts

    files = []
    for loader in loaders:
        for where, dataset in openmmlab_tools.datasets((cfg.get(loader) or {}).get("dataset"), loader + ".dataset"):
            if str(dataset.get("type", "")).startswith("LVIS") and not dataset.get("backend_args"):
                files += [(f"{where}.ann_file", path) for key, path, _ in openmmlab_tools.dataset_files(dataset)
                          if key == "ann_file"]
    for name in ("val_evaluator", "test_evaluator"):
        if name.split("_")[0] + "_dataloader" not in loaders:
            continue
        for where, evaluator in _evaluators(cfg.get(name), name):
            if str(evaluator.get("type", "")).endswith("LVISMetric") and evaluator.get("ann_file"):
                files.append((f"{where}.ann_file", evaluator["ann_file"]))
    for where, path in files:
        check_lvis_annotations(path, f"{where}:")
    for where, loss in openmmlab_tools.config_dicts(cfg.get("model"), "model") if "train_dataloader" in loaders else ():
        if loss.get("type") != "FederatedSigmoidCELoss":
            continue
        try:
            class_image_counts(loss.get("image_counts", LVIS_V1), loss.get("num_classes", 1203))
        except LVISFormatError as e:
            raise LVISFormatError(f"{where}.image_counts: {e}") from None


def _evaluators(evaluator, name):
    """(config path, metric dict) of each metric of an evaluator config (one dict or a list)."""
    if isinstance(evaluator, dict):
        yield name, evaluator
    elif isinstance(evaluator, (list, tuple)):
        for i, metric in enumerate(evaluator):
            yield f"{name}.{i}", metric


def _missing_data_message(cfg, where, dataset, key, path) -> str:
    evaluators = " ".join(f"{where}.ann_file=DATA_ROOT/annotations/instances_val2017.json"
                          for name in ("val_evaluator", "test_evaluator")
                          for where, metric in _evaluators(cfg.get(name), name) if "ann_file" in metric)
    return (
        openmmlab_tools.missing_path(where, dataset, key, path) + "\n"
        f"Expected layout: {openmmlab_tools.expected_layout(cfg)}; for COCO 2017, DATA_ROOT is the folder "
        "holding train2017/, val2017/ and annotations/.\n"
        "Fix: put the dataset there, or point the config at your copy (DATA_ROOT ending in /) with\n"
        "  --cfg-options train_dataloader.dataset.data_root=DATA_ROOT val_dataloader.dataset.data_root=DATA_ROOT "
        f"test_dataloader.dataset.data_root=DATA_ROOT {evaluators}\n"
        "or, to try the tools without COCO, generate synthetic data in that layout:\n"
        "  python tools/make_synthetic_coco.py --root datasets   "
        "(DATA_ROOT = datasets/coco/; see make quickstart-mmdet)")
