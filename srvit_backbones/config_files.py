"""Where each framework's shipped configs are: the repository's ``detectron2_configs/``,
``mmdet_configs/``, ``mmseg_configs/`` in a checkout, ``srvit_backbones/_configs/`` when installed
(setup.py). The folders are the framework table's (``frameworks.register_framework``)."""
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
    """The folder of ``framework``'s shipped configs; ValueError for a framework that ships none."""
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
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith(
        ("_", ".", "common")) and any(f.endswith(".py") for f in os.listdir(os.path.join(root, d))))


def resolve_config(framework: str, path: str) -> str:
    """A config file path, or the path of a shipped config named ``path`` (``upernet_srvit_s.py``).

    Raises:
        FileNotFoundError: neither (the message names the shipped configs).
    """
    if os.path.isfile(path):
        return path
    if framework not in _FOLDERS:
        raise FileNotFoundError(f"config {path!r} not found: no such file (the {framework} framework ships no "
                                f"configs to name)")
    shipped = config_path(framework, path)
    if shipped is None:
        folders = config_folders(framework)
        named = (f"; and in the folders {', '.join(f + '/' for f in folders)}: name them as FOLDER/NAME.py, e.g. "
                 f"{list_configs(framework, folders[0])[0]}" if folders else "")
        raise FileNotFoundError(f"config {path!r} not found: neither a file nor a shipped {framework} config "
                                f"(shipped: {', '.join(list_configs(framework))}{named})")
    return shipped
