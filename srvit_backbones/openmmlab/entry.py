"""mmdet's and mmseg's ``tools/train.py`` / ``test.py``, once for both (differences: ``tools.SCRIPT_OPTIONS``)."""
import argparse
import os.path as osp

from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ..errors import CheckpointError
from ..frameworks import adapter
from .fine_tune import check_load_from
from .runner import SRViTRunner
from .tools import apply_amp, check_compile, prepare_training


class ScriptOptions:
    """What a framework's own tools/train.py and test.py add. A subclass sets ``train_description``,
    ``test_description``, ``out_help`` and defines ``add_train_arguments(parser)`` (after ``--work-dir``),
    ``apply_train_arguments(cfg, args)`` (after ``--amp``, before the data check) and ``apply_test_arguments(cfg,
    args)`` (after the data check); the rest has defaults."""

    show_dir_help = "directory where painted images will be saved"

    def add_test_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The test options after ``--launcher``."""

    def check_test_arguments(self, args: argparse.Namespace) -> None:
        """Refuse test options that cannot work, before the config is read."""


def add_amp_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--amp", action="store_true", default=False, help="enable automatic-mixed-precision training")


def _add_overrides_and_launcher(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cfg-options", nargs="+", action=DictAction,
                        help="override some settings in the used config, key=value pairs")
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"], default="none", help="job launcher")


def build_train_runner(framework: str, argv=None) -> Runner:
    """The Runner the training tool trains: the command line applied, compile and data checked, ``load_from`` too."""
    tools = adapter(framework).tools
    parser = argparse.ArgumentParser(description=tools.SCRIPT_OPTIONS.train_description)
    parser.add_argument("config", help="train config file path (or the name of a shipped config)")
    parser.add_argument("--work-dir", help="the dir to save logs and models")
    tools.SCRIPT_OPTIONS.add_train_arguments(parser)
    _add_overrides_and_launcher(parser)
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0)
    tools.add_data_arguments(parser)
    args = parser.parse_args(argv)
    cfg = tools.load_config(args)
    apply_amp(cfg, args.amp)
    check_compile(cfg)
    tools.SCRIPT_OPTIONS.apply_train_arguments(cfg, args)
    tools.check_data(cfg, ("train_dataloader", "val_dataloader"), read_files=not args.skip_data_check)
    runner = build_runner(cfg)
    check_load_from(runner)
    return runner


def build_runner(cfg: Config) -> Runner:
    """The config's runner (``SRViTRunner`` unless ``runner_type`` names another), ``prepare_training`` applied."""
    if cfg.get("runner_type", "SRViTRunner") == "SRViTRunner":
        return SRViTRunner.from_cfg(cfg)  # applies prepare_training
    prepare_training(cfg)
    return RUNNERS.build(cfg)


def run_train(framework: str, argv=None) -> None:
    build_train_runner(framework, argv).train()


def parse_test_args(framework: str, argv=None) -> argparse.Namespace:
    """The test tool's command line: mmengine's ``tools/test.py`` arguments and the framework's."""
    options = adapter(framework).tools.SCRIPT_OPTIONS
    parser = argparse.ArgumentParser(description=options.test_description)
    parser.add_argument("config", help="test config file path (or the name of a shipped config)")
    parser.add_argument("checkpoint", help="checkpoint file")
    parser.add_argument("--work-dir", help="the directory to save the file containing evaluation metrics")
    parser.add_argument("--out", help=options.out_help)
    parser.add_argument("--show-dir", help=options.show_dir_help)
    _add_overrides_and_launcher(parser)
    options.add_test_arguments(parser)
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0)
    return parser.parse_args(argv)


def run_test(framework: str, argv=None) -> None:
    """Test the config's model with the checkpoint (``CheckpointError`` when it does not exist)."""
    tools = adapter(framework).tools
    args = parse_test_args(framework, argv)
    if not osp.isfile(args.checkpoint):
        raise CheckpointError(f"checkpoint {args.checkpoint!r} does not exist")
    tools.SCRIPT_OPTIONS.check_test_arguments(args)
    cfg = tools.load_config(args)
    cfg.load_from = args.checkpoint
    tools.check_data(cfg, ("test_dataloader",))
    tools.SCRIPT_OPTIONS.apply_test_arguments(cfg, args)
    build_runner(cfg).test()
