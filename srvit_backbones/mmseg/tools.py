"""Helpers of tools/train_seg.py and tools/test_seg.py: mmseg's own scripts' logic, and what a
missing ADE20K looks like."""
from mmengine.config import Config

from ..openmmlab import tools as openmmlab_tools
from ..openmmlab.tools import apply_amp, check_compile, prepare_training  # noqa: F401  (the tools' imports)


def load_config(args) -> Config:
    return openmmlab_tools.load_config(args, "mmseg")


def check_data(cfg: Config, loaders) -> None:
    openmmlab_tools.check_data(cfg, loaders, _missing_data_message)


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
