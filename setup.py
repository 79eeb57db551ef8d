"""srvit-backbones: SR-ViT (Soft Mixture-of-Recursions ViT) backbones for dense prediction."""
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def config_files(folder):
    """Configs ship inside the package (srvit_backbones/configs/<folder>) so that a
    non-editable install finds them through `srvit_backbones.config_path`."""
    out = []
    for root, _, files in os.walk(os.path.join(HERE, folder)):
        rel = os.path.relpath(root, HERE)
        out.append((rel, [os.path.join(rel, f) for f in files if f.endswith(".py")]))
    return out


setup(
    name="srvit-backbones",
    version="0.1.0",
    description="SR-ViT recursive vision transformer backbones for Detectron2, MMSegmentation and timm",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["srvit_backbones", "srvit_backbones.*"]),
    package_dir={"srvit_backbones": "srvit_backbones"},
    # detectron2_configs/ and mmseg_configs/ live at the top level for users of the source
    # tree; setup copies them into the package for installed use.
    package_data={"srvit_backbones": ["configs/detectron2/*.py", "configs/detectron2/**/*.py",
                                      "configs/mmseg/*.py", "configs/mmseg/**/*.py"]},
    install_requires=["torch>=2.1", "timm>=1.0.9,<1.1"],
    extras_require={
        "detectron2": ["fvcore", "iopath", "pycocotools", "omegaconf>=2.1,<2.4", "hydra-core",
                       "tensorboard", "setuptools<81"],
        "mmseg": ["mmengine>=0.10,<0.11", "mmcv>=2.0.0rc4,<2.2.0", "mmsegmentation==1.2.2",
                  "mmdet==3.3.0", "ftfy", "regex"],
        "pretrain": [],
        "dev": ["pytest", "pytest-timeout", "fvcore", "scikit-image", "matplotlib"],
    },
    entry_points={"console_scripts": ["srvit-collect-env=srvit_backbones.collect_env:main"]},
)
