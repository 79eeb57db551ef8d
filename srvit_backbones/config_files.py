"""Where the shipped configs of each framework are.

In a source checkout (or an editable install) they are the repository's
``detectron2_configs/``, ``mmseg_configs/`` and ``mmdet_configs/``; a regular install copies them into
``srvit_backbones/_configs/`` (see setup.py). The folders are the framework table's
(``srvit_backbones.frameworks.register_framework``), which fills ``_FOLDERS``.
"""
import os
from typing import Dict, List, Optional

_FOLDERS: Dict[str, str] = {}
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def register_config_folder(framework: str, folder: Optional[str]) -> None:
    """Where ``framework``'s shipped configs are (None: it ships none); the framework table's."""
    if folder is None:
        _FOLDERS.pop(framework, None)
    else:
        _FOLDERS[framework] = folder


def config_dir(framework: str) -> str:
    if framework not in _FOLDERS:
        raise ValueError(f"framework must be one of {list(_FOLDERS)}, got {framework!r}")
    folder = _FOLDERS[framework]
    for candidate in (os.path.join(os.path.dirname(_PACKAGE), folder), os.path.join(_PACKAGE, "_configs", folder)):
        if os.path.isdir(candidate):
            return candidate
    raise FileNotFoundError(f"the {folder}/ folder is neither in the source tree nor in the installed package")


def config_path(framework: str, name: str) -> Optional[str]:
    """Absolute path of a shipped config (``mask_rcnn_srvit_s_t3.py``), or None."""
    path = os.path.join(config_dir(framework), name)
    return path if os.path.isfile(path) else None


def list_configs(framework: str, folder: Optional[str] = None) -> List[str]:
    """The shipped configs' names: the top folder's (the Mask R-CNN ones), or a subfolder's as
    ``folder/name.py`` (``list_configs("detectron2", "cascade")``), the names ``resolve_config``
    and the tools take."""
    root = config_dir(framework)
    if folder is None:
        return sorted(f for f in os.listdir(root) if f.endswith(".py"))
    folder = folder.strip("/")
    if not folder or folder.startswith(("_", "common")) or not os.path.isdir(os.path.join(root, folder)):
        raise FileNotFoundError(f"no shipped {framework} config folder {folder!r} (folders: "
                                f"{', '.join(config_folders(framework))})")
    return sorted(f"{folder}/{f}" for f in os.listdir(os.path.join(root, folder)) if f.endswith(".py"))


def config_folders(framework: str) -> List[str]:
    """The subfolders that hold shipped configs (not ``common/`` nor ``_base_/``)."""
    root = config_dir(framework)
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))
                  and not d.startswith(("_", ".", "common")) and any(f.endswith(".py") for f in os.listdir(os.path.join(root, d))))


def resolve_config(framework: str, path: str) -> str:
    """A config file path, or the name of a shipped config (``upernet_srvit_s.py``); the
    one lookup both frameworks' tools use. Raises ``FileNotFoundError`` naming the choices."""
    if os.path.isfile(path):
        return path
    if framework not in _FOLDERS:
        raise FileNotFoundError(f"config {path!r} not found: no such file (the {framework} framework ships no "
                                f"configs to name)")
    shipped = config_path(framework, path)
    if shipped is None:
        raise FileNotFoundError(f"config {path!r} not found: neither a file nor a shipped {framework} config "
                                f"(shipped: {', '.join(list_configs(framework))}; and in the folders "
                                f"{', '.join(f + '/' for f in config_folders(framework))}: name them as "
                                f"FOLDER/NAME.py, e.g. {list_configs(framework, config_folders(framework)[0])[0]})"
                                if config_folders(framework) else
                                f"config {path!r} not found: neither a file nor a shipped {framework} config "
                                f"(shipped: {', '.join(list_configs(framework))})")
    return shipped
