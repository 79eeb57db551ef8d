"""Print the versions that matter for a bug report (like detectron2's collect_env)."""
import importlib
import os
import platform
import sys


def _version(name, attr="__version__"):
    try:
        module = importlib.import_module(name)
    except Exception as e:  # any import failure is worth reporting, not raising
        return None, f"not importable ({type(e).__name__}: {e})".splitlines()[0][:120]
    return module, getattr(module, attr, "unknown")


def collect_env() -> str:
    """One ``name  version`` line per library (and the GPUs)."""
    rows = [("Python", sys.version.split()[0] + f" ({sys.executable})"),
            ("platform", platform.platform())]
    torch, ver = _version("torch")
    rows.append(("torch", ver))
    if torch is not None:
        rows += [("CUDA available", str(torch.cuda.is_available())), ("torch CUDA build", str(torch.version.cuda))]
        rows += [(f"GPU {i}", torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]
    rows.append(("torchvision", _version("torchvision")[1]))
    d2, ver = _version("detectron2")
    if d2 is not None:
        source_file = os.path.join(os.path.dirname(d2.__file__), ".srvit_source")
        source = open(source_file).read().strip() if os.path.exists(source_file) else "preinstalled"
        ver = f"{ver} @ {os.path.dirname(d2.__file__)} (from: {source})"
    rows.append(("detectron2", ver))
    mmcv, ver = _version("mmcv")
    if mmcv is not None:
        try:
            importlib.import_module("mmcv.ops")
            ver += " (with compiled ops)"
        except Exception as e:
            ver += f" (WITHOUT ops: {type(e).__name__})"
    rows.append(("mmcv", ver))
    rows += [(label, _version(name)[1]) for name, label in [("mmengine", "mmengine"), ("mmseg", "mmsegmentation"),
             ("mmdet", "mmdet"), ("timm", "timm"), ("fvcore", "fvcore"), ("numpy", "numpy")]]
    srvit, ver = _version("srvit_backbones")
    rows.append(("srvit_backbones", f"{ver} @ {os.path.dirname(srvit.__file__)}" if srvit else ver))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main():
    print(collect_env())


if __name__ == "__main__":
    main()
