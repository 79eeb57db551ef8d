"""Fast status of the set-up's components for tools/setup.sh: package metadata and module
files only, no heavy imports (the real imports run once, in collect_env, at the end).
Prints one ``name=ok`` / ``name=missing`` line per component."""
import importlib.metadata as md
import importlib.util
import os
import sys


def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def main(repo):
    v = lambda d: (version(d) or "").split("+")[0]  # noqa: E731
    status = {
        "torch": v("torch") == "2.14.1" and v("torchvision") == "0.29.1",
        "detectron2": importlib.util.find_spec("detectron2") is not None,
        "mmcv": v("mmcv") == "2.1.0" and importlib.util.find_spec("mmcv._ext") is not None,
        "mmseg": v("mmsegmentation") == "1.2.2" and v("mmdet") == "3.3.0",
    }
    spec = importlib.util.find_spec("srvit_backbones")
    status["srvit"] = bool(spec and spec.origin and
                           os.path.samefile(os.path.dirname(spec.origin), os.path.join(repo, "srvit_backbones")))
    for name, ok in status.items():
        print(f"{name}={'ok' if ok else 'missing'}")


if __name__ == "__main__":
    main(sys.argv[1])
