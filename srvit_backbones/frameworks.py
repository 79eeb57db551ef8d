"""The one table of framework adapters, and what the tools ask of each.

A tool that serves every framework (the demo, count_flops, check_data, the GPU check) never
tests a framework's name: it looks the config up here (``resolve``) and calls the adapter's
methods (``FrameworkAdapter``). A framework is one row of ``register_framework``: its name, the
task it serves, where its shipped configs are, how to recognise one of its config files, and
the adapter class (imported only when asked for, so importing ``srvit_backbones`` imports no
framework). A new framework, or a second family of one, is one call to ``register_framework``
with a ``FrameworkAdapter`` subclass, made by the process or by an installed package's
``srvit_backbones.frameworks`` entry point: nothing under tools/ or models/ changes
(docs/frameworks.md).

This module imports no framework and nothing of the package but ``config_files``.
"""
import ast
import importlib
import importlib.metadata
import os
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .config_files import config_dir, config_folders, config_path, list_configs, register_config_folder

TASKS = ("classification", "detection", "segmentation")


class FrameworkAdapter:
    """What the tools need of a framework, asked the same way of each. Subclasses live in the
    framework's adapter folder (``srvit_backbones/detectron2/adapter.py``...) and import the
    framework; a method a framework cannot serve raises ``NotImplementedError`` naming it.

    ``name`` and ``task`` are set from the table's row when the adapter is built.
    """

    name: str = ""
    task: str = ""
    #: where a checkpoint that fits this framework's models comes from (the demo's and the
    #: loaders' "Fix:" when a checkpoint does not fit)
    checkpoint_hint: str = ""

    def load_config(self, path: str, opts: Sequence[str] = ()):
        """The framework's config object of ``path`` with the ``KEY=VALUE`` overrides ``opts``
        applied as the framework's own tools apply them."""
        raise NotImplementedError(f"{self.name} does not load configs")

    def build_demo(self, cfg, checkpoint: str, device: str = "cpu", amp: bool = False,
                   score_threshold: float = 0.5, opacity: float = 0.5):
        """A ``srvit_backbones.demo.Demo`` of the model ``cfg`` (a ``load_config`` result)
        with the weights of ``checkpoint``, refusing one that does not fit the model entirely."""
        raise NotImplementedError(f"{self.name} has no demo")

    def count_flops(self, path: str, counted, plain: bool = False) -> dict:
        """One row of count_flops' whole-model table (``srvit_backbones.flops_table.table_row``) for
        the config file ``path``; ``counted`` (a ``srvit_backbones.flops.Counted``) carries what
        earlier configs of the same call counted; ``plain``: one trace of the whole model."""
        raise NotImplementedError(f"{self.name} has no FLOP count")

    def check_data(self, path: str, args) -> None:
        """tools/check_data.py's check of every dataset of the config ``path``, with the
        command line ``args`` (your own data's options, the overrides)."""
        raise NotImplementedError(f"{self.name} has no data check")

    def time_training(self, config: str, size: int, images: int, device, warmup: int, steps: int) -> dict:
        """The GPU check's training step (``srvit_backbones.benchmark.gpu_check``): ``warmup +
        steps`` training iterations of the config (a path or a shipped name) at input ``size``,
        ``images`` synthetic images per step on ``device`` (a ``torch.device``), through the
        framework's own trainer or optim wrapper with the AMP a GPU user switches on (on the CPU:
        bf16 where it is native, else fp32). Returns the check's row: the config, size, images,
        what stepped it, the autocast dtype, the loss (and loss scale), and
        ``Timer.summary(warmup)``'s s/iter and peak memory."""
        raise NotImplementedError(f"{self.name} has no GPU check training step")


@dataclass(frozen=True)
class Framework:
    """One row of the table: a framework as the tools see it before importing it."""

    name: str
    task: str
    #: ``"module:Class"`` of its ``FrameworkAdapter`` (imported when first asked for), or the class
    adapter: Union[str, type]
    #: the folder of its shipped configs, beside the package in a checkout (None: ships none)
    config_folder: Optional[str] = None
    #: whether a config file (its path and text) is this framework's, when its folder does not tell
    recognizes: Callable[[str, str], bool] = lambda path, text: False


#: the entry-point group through which an installed package adds its framework: each entry is a
#: function of no arguments that calls ``register_framework`` (setup.py:
#: ``entry_points={"srvit_backbones.frameworks": ["mine=my_package.srvit:register"]}``), called
#: once, when the table is first read
FRAMEWORKS_GROUP = "srvit_backbones.frameworks"
_TABLE: Dict[str, Framework] = {}
_ADAPTERS: Dict[str, FrameworkAdapter] = {}
_PLUGINS_LOADED = []


def _table() -> Dict[str, Framework]:
    """The table, with the frameworks of installed packages' entry points registered."""
    if not _PLUGINS_LOADED:
        _PLUGINS_LOADED.append(True)
        for point in importlib.metadata.entry_points(group=FRAMEWORKS_GROUP):
            try:
                point.load()()
            except Exception as e:  # a broken plugin does not hide the other frameworks, and says so
                warnings.warn(f"the framework entry point {point.name} = {point.value} ({FRAMEWORKS_GROUP}) "
                              f"failed: {type(e).__name__}: {e}; its framework is not in the table")
    return _TABLE


def register_framework(name: str, task: str, adapter: Union[str, type], config_folder: Optional[str] = None,
                       recognizes: Optional[Callable[[str, str], bool]] = None) -> Framework:
    """Add (or replace) a row of the table; see ``Framework`` for the fields."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    row = Framework(name, task, adapter, config_folder, recognizes or Framework.recognizes)
    _TABLE[name] = row
    _ADAPTERS.pop(name, None)
    if config_folder:
        register_config_folder(name, config_folder)
    return row


def unregister_framework(name: str) -> None:
    """Remove a row added by ``register_framework`` (a test's own framework, for one)."""
    row = _TABLE.pop(name)
    _ADAPTERS.pop(name, None)
    if row.config_folder:
        register_config_folder(name, None)


def frameworks(task: Optional[str] = None) -> List[str]:
    """The table's framework names in the order they were registered, those of ``task`` only
    when given."""
    return [name for name, row in _table().items() if task is None or row.task == task]


def framework(name: str) -> Framework:
    if name not in _table():
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
    for row in _table().values():
        if row.config_folder:
            root = config_dir(row.name)
            if os.path.commonpath([path, root]) == root:
                return row.name
    return None


def framework_of(path: str) -> Optional[str]:
    """The framework a config file is for: the shipped folder it sits in, else the one row that
    recognises it (its suffix or text); None when that does not tell. A bare name is looked up
    among the shipped configs."""
    if not os.path.isfile(path):
        found = _shipped_as(path, frameworks())
        return found[0][0] if len(found) == 1 else None
    shipped = shipped_in(path)
    if shipped:
        return shipped
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    found = [row.name for row in _table().values() if row.recognizes(path, text)]
    return found[0] if len(found) == 1 else None


def resolve(config: str, framework_name: Optional[str] = None, task: Optional[str] = None) -> Tuple[str, str]:
    """(framework, absolute path) of a config path or a shipped config's name, the framework
    given or found by ``framework_of``. Raises FileNotFoundError naming the shipped configs when
    ``config`` is neither, ValueError naming the choices when the framework cannot be told."""
    candidates = [framework_name] if framework_name else frameworks(task)
    for name in candidates:
        framework(name)  # an unknown name is a ValueError naming the known ones
    if os.path.isfile(config):
        path = os.path.abspath(config)
    else:
        found = _shipped_as(config, candidates)
        if not found:
            raise FileNotFoundError(f"config {config!r} not found: neither a file nor a shipped config ("
                                    + "; ".join(f"{name}: {', '.join(_shipped_names(name))}" for name in candidates
                                                if framework(name).config_folder) + ")")
        if len(found) > 1 and not framework_name:
            raise ValueError(f"{config!r} is shipped for {' and '.join(name for name, _ in found)}: pass --framework")
        return found[0]
    if framework_name:
        return framework_name, path
    name = framework_of(path)
    if name is None or name not in candidates:
        raise ValueError(f"cannot tell which framework {config!r} is for ({', '.join(candidates)}): pass "
                         f"--framework")
    return name, path


def load_config(config: str, framework_name: Optional[str] = None, opts: Sequence[str] = ()):
    """(framework, its config object) of a config path or shipped name, with the overrides
    ``opts``: the config loader of every tool, whatever the framework."""
    name, path = resolve(config, framework_name)
    return name, adapter(name).load_config(path, opts)


def _shipped_as(config: str, names: Sequence[str]) -> List[Tuple[str, str]]:
    """(framework, path) of each of the frameworks ``names`` that ships a config named ``config``."""
    return [(name, path) for name in names if framework(name).config_folder
            for path in [config_path(name, config)] if path]


def _shipped_names(name: str) -> List[str]:
    return list_configs(name) + [n for folder in config_folders(name) for n in list_configs(name, folder)]


def _imports_detectron2(path: str, text: str, depth: int = 0) -> bool:
    """A LazyConfig (.py importing detectron2 or our detectron2 adapter, itself or through the
    configs it imports relatively) or the config.yaml tools/train_net.py saves."""
    if path.endswith((".yaml", ".yml")) or ("detectron2" in text and "_base_" not in text) or re.search(
            r"^\s*(from|import)\s+(detectron2|srvit_backbones\.detectron2)", text, re.M):
        return True
    for dots, module in re.findall(r"^from\s+(\.+)([\w.]*)\s+import", text, re.M) if depth < 8 else ():
        folder = os.path.dirname(path)
        for _ in range(len(dots) - 1):
            folder = os.path.dirname(folder)
        imported = os.path.join(folder, *module.split(".")) + ".py"
        if os.path.isfile(imported):
            with open(imported, encoding="utf-8", errors="replace") as f:
                if _imports_detectron2(imported, f.read(), depth + 1):
                    return True
    return False


def _mmengine_scope(scope: str) -> Callable[[str, str], bool]:
    """An mmengine config of ``default_scope = scope``, written in it or in the ``_base_`` files
    it inherits from, else one that names ``scope`` (``mmseg.``, ``mmseg_configs``...)."""

    def recognizes(path: str, text: str) -> bool:
        if not path.endswith(".py") or _imports_detectron2(path, text):
            return False
        said = _default_scope(path, text)
        return said == scope if said else bool(re.search(rf"\b{scope}\b|{scope}_configs", text))

    return recognizes


def _default_scope(path: str, text: str, depth: int = 0) -> Optional[str]:
    """The ``default_scope`` an mmengine config sets or inherits through ``_base_`` (read as
    text, so that telling a config's framework imports none); a ``_base_`` in a package's
    configs (``'mmdet::_base_/default_runtime.py'``) stands for that package's scope."""
    said = re.search(r"^default_scope\s*=\s*['\"](\w+)['\"]", text, re.M)
    if said or depth > 8:
        return said.group(1) if said else None
    try:
        body = ast.parse(text).body
    except SyntaxError:  # not a config its framework could read either: the tool's --framework error says so
        return None
    for node in body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_base_" for t in node.targets):
            try:
                bases = ast.literal_eval(node.value)
            except ValueError:
                return None
            for base in [bases] if isinstance(bases, str) else bases:
                if "::" in base:  # a file of an installed package's configs: 'mmdet::_base_/...'
                    return base.split("::")[0]
                base = os.path.join(os.path.dirname(path), base)
                if os.path.isfile(base):
                    with open(base, encoding="utf-8", errors="replace") as f:
                        found = _default_scope(base, f.read(), depth + 1)
                    if found:
                        return found
    return None


register_framework("detectron2", "detection", "srvit_backbones.detectron2.adapter:Detectron2Adapter",
                   "detectron2_configs", _imports_detectron2)
register_framework("mmdet", "detection", "srvit_backbones.mmdet.adapter:MMDetAdapter", "mmdet_configs",
                   _mmengine_scope("mmdet"))
register_framework("mmseg", "segmentation", "srvit_backbones.mmseg.adapter:MMSegAdapter", "mmseg_configs",
                   _mmengine_scope("mmseg"))
