"""mmseg's side of tools/train_seg.py and tools/test_seg.py (``openmmlab.entry``): mmseg's own script
options, your own image and label-map folders, and what a missing ADE20K looks like."""
import collections
import os

from mmengine.config import Config

from ..data.check import add_segmentation_arguments, add_skip_argument
from ..errors import ConfigError, InputError
from ..openmmlab import data_check as openmmlab_data_check
from ..openmmlab import tools as openmmlab_tools
from ..openmmlab.entry import ScriptOptions, add_amp_argument

#: how the tools size the heads from the data
SIZED_FROM_DATA = "or train with --seg-train / --seg-val / --classes, which size the heads from the class file"


class MMSegScriptOptions(ScriptOptions):
    """mmseg's tools/train.py and test.py: ``--resume`` a flag, ``--tta``, ``--out`` a folder of maps."""

    train_description = "Train a segmentor"
    test_description = "MMSeg test (and eval) a model"
    out_help = "the directory to save the output prediction"

    def add_train_arguments(self, parser):
        parser.add_argument("--resume", action="store_true", default=False,
                            help="resume from the latest checkpoint in the work_dir automatically")
        add_amp_argument(parser)

    def apply_train_arguments(self, cfg, args):
        cfg.resume = args.resume

    def add_test_arguments(self, parser):
        parser.add_argument("--tta", action="store_true", help="test time augmentation (multi-scale + flip)")

    def apply_test_arguments(self, cfg, args):
        if args.show_dir:
            cfg.default_hooks.visualization.update(draw=True, show=False, img_dir=args.show_dir)
        if args.tta:
            cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
            cfg.tta_model.module = cfg.model
            cfg.model = cfg.tta_model
        if args.out is not None:
            cfg.test_evaluator["output_dir"] = args.out
            cfg.test_evaluator["keep_results"] = True


SCRIPT_OPTIONS = MMSegScriptOptions()


def add_data_arguments(parser) -> None:
    """The training tool's options for your own data and the one that skips the data check."""
    add_segmentation_arguments(parser)
    add_skip_argument(parser)


def load_config(args) -> Config:
    return openmmlab_tools.load_config(args, "mmseg", lambda cfg: use_seg_folders(
        cfg, getattr(args, "seg_train", None), getattr(args, "seg_val", None), getattr(args, "classes", None),
        getattr(args, "reduce_zero_label", False)))


def read_class_file(path: str):
    """(class names, palette or None) of a class file: a line ``NAME [R G B]`` per class, ``#`` comments.

    Raises:
        InputError: a line that is none, or a file without classes.
    """
    names, palette = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) not in (1, 4) or (len(fields) == 4 and not all(v.isdigit() and int(v) < 256
                                                                            for v in fields[1:])):
                raise InputError(f"{path} line {number}: {line.strip()!r}: expected 'NAME' or 'NAME R G B' "
                                 f"(colour values 0-255)")
            names.append(fields[0])
            if len(fields) == 4:
                palette.append([int(v) for v in fields[1:]])
    if not names:
        raise InputError(f"{path} lists no class: write one 'NAME [R G B]' line per class")
    return tuple(names), (palette if len(palette) == len(names) else None)


def _suffix(folder: str) -> str:
    """The most common file extension in ``folder``; an ``InputError`` when it holds no file."""
    counts = collections.Counter(os.path.splitext(name)[1] for _, _, files in os.walk(folder) for name in files)
    if not counts:
        raise InputError(f"{folder} holds no files: pass the folder of the split's images")
    return counts.most_common(1)[0][0]


def use_seg_folders(cfg: Config, train, val=None, class_file=None, reduce_zero_label=False) -> None:
    """``cfg`` on your own folders, in place: ``train`` / ``val`` = (image folder, label folder) read by
    ``BaseSegDataset``, ``metainfo`` and the heads' ``num_classes`` from the class file.

    Raises:
        ConfigError: options that do not go together.
    """
    if not train:
        if val or class_file:
            raise ConfigError("--seg-val and --classes go with --seg-train (the folders to train on)")
        return
    if not class_file:
        raise ConfigError("--seg-train needs --classes FILE: a line 'NAME [R G B]' per class")
    classes, palette = read_class_file(class_file)
    metainfo = dict(classes=classes, **({"palette": palette} if palette else {}))
    val = val or train
    for loader, (images, labels) in (("train_dataloader", train), ("val_dataloader", val), ("test_dataloader", val)):
        if cfg.get(loader):
            dataset = openmmlab_data_check.innermost_dataset(cfg, loader)
            dataset.update(type="BaseSegDataset", data_root="", ann_file="", metainfo=metainfo,
                           data_prefix=dict(img_path=os.path.abspath(images), seg_map_path=os.path.abspath(labels)),
                           img_suffix=_suffix(images), seg_map_suffix=".png", reduce_zero_label=reduce_zero_label)
    for _, transform in openmmlab_tools.config_dicts(cfg._cfg_dict):
        if transform.get("type") == "LoadAnnotations":
            transform["reduce_zero_label"] = reduce_zero_label
    openmmlab_data_check.set_num_classes(cfg.model, len(classes))


def check_data(cfg: Config, loaders, read_files: bool = False) -> None:
    """The datasets' paths, class counts and, with ``read_files``, every image and label map."""
    openmmlab_tools.check_data(cfg, loaders, _missing_data_message)
    from mmseg.registry import DATASETS

    openmmlab_data_check.check_against_data(cfg, loaders, DATASETS, SIZED_FROM_DATA, read_files)


def _missing_data_message(cfg, where, dataset, key, path) -> str:
    ade = "; for ADE20K, DATA_ROOT is the unpacked ADEChallengeData2016 folder" \
        if dataset.get("type") == "ADE20KDataset" else ""
    return (
        openmmlab_tools.missing_path(where, dataset, key, path) + "\n"
        f"Expected layout: {openmmlab_tools.expected_layout(cfg)}{ade}.\n"
        "Fix: put the dataset there, or point the config at your copy with\n"
        "  --cfg-options train_dataloader.dataset.data_root=DATA_ROOT "
        "val_dataloader.dataset.data_root=DATA_ROOT test_dataloader.dataset.data_root=DATA_ROOT\n"
        "or, to try the tools without ADE20K, generate synthetic data in that layout:\n"
        "  python tools/make_synthetic_ade20k.py --root datasets   "
        "(DATA_ROOT = datasets/ade/ADEChallengeData2016; see make quickstart-mmseg)")
