"""The one table of framework adapters, and what the tools ask of each.

A tool that serves every framework (demo, count_flops, check_data, the GPU check) looks a config
up here (``resolve``) and calls its adapter (``FrameworkAdapter``); it never tests a framework's
name. A framework is one ``register_framework`` row whose adapter class is imported only when
asked for, so importing ``srvit_backbones`` imports no framework (docs/frameworks.md).
"""
import importlib
import os
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .config_files import config_dir, config_folders, config_path, list_configs, register_config_folder

TASKS = ("classification", "detection", "segmentation")


class FrameworkAdapter:
    """What the tools need of a framework; a method a framework cannot serve raises
    ``NotImplementedError``. ``name`` and ``task`` are set from the table's row."""

    name: str = ""
    task: str = ""
    #: where a checkpoint that fits this framework's models comes from (the "Fix:" of a refused one)
    checkpoint_hint: str = ""

    def load_config(self, path: str, opts: Sequence[str] = ()):
        """The framework's config object of ``path``, ``KEY=VALUE`` overrides ``opts`` applied."""
        raise NotImplementedError(f"{self.name} does not load configs")

    def build_demo(self, cfg, checkpoint: str, device: str = "cpu", amp: bool = False,
                   score_threshold: float = 0.5, opacity: float = 0.5):
        """A ``srvit_backbones.analysis.demo.Demo`` of the model ``cfg`` with the weights of ``checkpoint``,
        refusing one that does not fit the model entirely."""
        raise NotImplementedError(f"{self.name} has no demo")

    def count_flops(self, path: str, counted, plain: bool = False) -> dict:
        """count_flops' row (``flops_table.table_row``) of the config ``path``; ``counted``
        (``flops.Counted``) carries what earlier configs counted; ``plain``: trace the whole model."""
        raise NotImplementedError(f"{self.name} has no FLOP count")

    def check_data(self, path: str, args) -> None:
        """tools/check_data.py's check of every dataset of the config ``path`` with its command line ``args``."""
        raise NotImplementedError(f"{self.name} has no data check")

    def time_training(self, config: str, size: int, images: int, device, warmup: int, steps: int) -> dict:
        """The GPU check's row (``benchmark.gpu_check``): ``warmup + steps`` iterations of the
        framework's own trainer on ``config`` at input ``size``, ``images`` synthetic images a step."""
        raise NotImplementedError(f"{self.name} has no GPU check training step")


@dataclass(frozen=True)
class Framework:
    """One row of the table: a framework as the tools see it before importing it."""

    name: str
    task: str
    #: ``"module:Class"`` of its ``FrameworkAdapter`` (imported when first asked for), or the class
    adapter: Union[str, type]
    #: the folder of its shipped configs (None: ships none)
    config_folder: Optional[str] = None
    #: whether a config file (its path and text) is this framework's, when its folder does not tell
    recognizes: Callable[[str, str], bool] = lambda path, text: False


_TABLE: Dict[str, Framework] = {}
_ADAPTERS: Dict[str, FrameworkAdapter] = {}


def register_framework(name: str, task: str, adapter: Union[str, type], config_folder: Optional[str] = None,
                       recognizes: Optional[Callable[[str, str], bool]] = None) -> Framework:
    """Add (or replace) a row of the table; see ``Framework`` for the fields.

    Raises:
        ValueError: ``task`` is not one of ``TASKS``.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    row = Framework(name, task, adapter, config_folder, recognizes or Framework.recognizes)
    _TABLE[name] = row
    _ADAPTERS.pop(name, None)
    if config_folder:
        register_config_folder(name, config_folder)
    return row


def unregister_framework(name: str) -> None:
    """Remove a row added by ``register_framework``."""
    row = _TABLE.pop(name)
    _ADAPTERS.pop(name, None)
    if row.config_folder:
        register_config_folder(name, None)


def frameworks(task: Optional[str] = None) -> List[str]:
    """The table's framework names in the order they were registered, those of ``task`` only
    when given."""
    return [name for name, row in _TABLE.items() if task is None or row.task == task]


def framework(name: str) -> Framework:
    """The table's row ``name``; raises ValueError naming the known frameworks."""
    if name not in _TABLE:
        raise ValueError(f"unknown framework {name!r}: choose {', '.join(_TABLE)}")
    return _TABLE[name]


def adapter(name: str) -> FrameworkAdapter:
    """The framework's adapter (built once per process); an ImportError names what to install."""
    if name not in _ADAPTERS:
        row = framework(name)
        cls = row.adapter
        if isinstance(cls, str):
            module, _, attribute = cls.partition(":")
            try:
                cls = getattr(importlib.import_module(module), attribute)
            except ImportError as e:
                raise ImportError(f"the {name} adapter ({module}) does not import: {e}. Install {name} as "
                                  f"docs/install.md says (make setup installs every framework)") from e
        instance = cls()
        instance.name, instance.task = row.name, row.task
        _ADAPTERS[name] = instance
    return _ADAPTERS[name]


def shipped_in(path: str) -> Optional[str]:
    """The framework whose shipped config folder holds ``path``, or None."""
    path = os.path.abspath(path)
    for row in _TABLE.values():
        if row.config_folder:
            root = config_dir(row.name)
            if os.path.commonpath([path, root]) == root:
                return row.name
    return None


def framework_of(config: str) -> Optional[str]:
    """The framework of a config path or shipped name (see ``resolve``); None when that does not tell."""
    try:
        return resolve(config)[0]
    except (FileNotFoundError, ValueError):
        return None


def resolve(config: str, framework_name: Optional[str] = None) -> Tuple[str, str]:
    """(framework, absolute path) of a config path or a shipped config's name. A file in a shipped
    folder is that folder's framework's, any other the one row's that recognises it.

    Args:
        config: a path, or a shipped config's name (``cascade/NAME.py`` in a subfolder).
        framework_name: its framework, when its folder or text does not tell.

    Raises:
        FileNotFoundError: ``config`` is neither a file nor shipped (the message names the shipped configs).
        ValueError: the framework is unknown or cannot be told (the message names the choices).
    """
    candidates = [framework_name] if framework_name else frameworks()
    for name in candidates:
        framework(name)  # an unknown name is a ValueError naming the known ones
    if not os.path.isfile(config):
        found = _shipped_as(config, candidates)
        if not found:
            raise FileNotFoundError(f"config {config!r} not found: neither a file nor a shipped config ("
                                    + "; ".join(f"{name}: {', '.join(_shipped_names(name))}" for name in candidates
                                                if framework(name).config_folder) + ")")
        if len(found) > 1 and not framework_name:
            raise ValueError(f"{config!r} is shipped for {' and '.join(name for name, _ in found)}: pass --framework")
        return found[0]
    path = os.path.abspath(config)
    if framework_name:
        return framework_name, path
    found = [shipped_in(path)]
    if not found[0]:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        found = [row.name for row in _TABLE.values() if row.recognizes(path, text)]
    if len(found) != 1:
        raise ValueError(f"cannot tell which framework {config!r} is for ({', '.join(candidates)}): pass "
                         f"--framework")
    return found[0], path


def load_config(config: str, framework_name: Optional[str] = None, opts: Sequence[str] = ()):
    """(framework, its config object) of a config path or shipped name (see ``resolve``), with
    the ``KEY=VALUE`` overrides ``opts``: every tool's config loader."""
    name, path = resolve(config, framework_name)
    return name, adapter(name).load_config(path, opts)


def _shipped_as(config: str, names: Sequence[str]) -> List[Tuple[str, str]]:
    """(framework, path) of each of the frameworks ``names`` that ships a config named ``config``."""
    return [(name, path) for name in names if framework(name).config_folder
            for path in [config_path(name, config)] if path]


def _shipped_names(name: str) -> List[str]:
    return list_configs(name) + [n for folder in config_folders(name) for n in list_configs(name, folder)]


def _detectron2_config(path: str, text: str) -> bool:
    """The config.yaml tools/train_net.py saves, or a LazyConfig importing detectron2 (or our adapter, or a
    shipped config)."""
    return path.endswith((".yaml", ".yml")) or bool(re.search(r"^\s*(from|import)\s+\S*detectron2", text, re.M))


def _mmengine_config(scope: str) -> Callable[[str, str], bool]:
    """An mmengine config of ``default_scope = scope`` (every config a run saves in its work dir
    says it), else one that names ``scope`` (``mmseg::``, ``mmseg_configs``...)."""

    def recognizes(path: str, text: str) -> bool:
        if not path.endswith(".py") or _detectron2_config(path, text):
            return False
        said = re.search(r"^default_scope\s*=\s*['\"](\w+)['\"]", text, re.M)
        return said.group(1) == scope if said else bool(re.search(rf"\b{scope}\b|{scope}_configs", text))

    return recognizes


register_framework("detectron2", "detection", "srvit_backbones.detectron2.adapter:Detectron2Adapter",
                   "detectron2_configs", _detectron2_config)
register_framework("mmdet", "detection", "srvit_backbones.mmdet.adapter:MMDetAdapter", "mmdet_configs",
                   _mmengine_config("mmdet"))
register_framework("mmseg", "segmentation", "srvit_backbones.mmseg.adapter:MMSegAdapter", "mmseg_configs",
                   _mmengine_config("mmseg"))
