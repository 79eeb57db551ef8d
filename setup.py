"""srvit-backbones: SR-ViT (Soft Mixture-of-Recursions ViT) backbones for dense prediction."""
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG_FOLDERS = ("detectron2_configs", "mmseg_configs", "mmdet_configs")


class BuildPyWithConfigs(build_py):
    """Copy the top-level config folders into the package, so that a regular (non-editable)
    install finds them through ``srvit_backbones.config_path``."""

    def run(self):
        super().run()
        for folder in CONFIG_FOLDERS:
            target = os.path.join(self.build_lib, "srvit_backbones", "_configs", folder)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(os.path.join(HERE, folder), target,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(
    name="srvit-backbones",
    version="0.1.0",
    description="SR-ViT recursive vision transformer backbones for Detectron2, MMDetection, MMSegmentation and timm",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["srvit_backbones", "srvit_backbones.*"]),
    cmdclass={"build_py": BuildPyWithConfigs},
    install_requires=["torch>=2.1", "timm>=1.0.9,<1.1"],
    extras_require={
        # detectron2 itself is not on PyPI: tools/setup.sh installs it (see README)
        "detectron2": ["fvcore", "iopath", "pycocotools", "omegaconf>=2.1,<2.4", "hydra-core", "cloudpickle",
                       "tensorboard", "setuptools<81"],
        # mmcv must be built with its ops: tools/setup.sh does it once per machine
        "mmseg": ["mmengine>=0.10,<0.11", "mmcv>=2.0.0rc4,<2.2.0", "mmsegmentation==1.2.2", "mmdet==3.3.0",
                  "ftfy", "regex"],
        "mmdet": ["mmengine>=0.10,<0.11", "mmcv>=2.0.0rc4,<2.2.0", "mmdet==3.3.0", "pycocotools", "shapely",
                  "terminaltables"],
        "dev": ["pytest", "pytest-timeout", "fvcore", "scikit-image", "matplotlib"],
        # tools/export_onnx.py: torch.onnx's dynamo exporter (onnxscript) and its check (onnxruntime)
        "deploy": ["onnx", "onnxscript", "onnxruntime"],
    },
    entry_points={
        "console_scripts": ["srvit-collect-env=srvit_backbones.collect_env:main"],
        # the types a framework writes into its checkpoints, allow-listed by its adapter when
        # srvit_backbones.checkpoint.read_checkpoint meets one (torch's weights_only loading)
        "srvit_backbones.checkpoint_types": [
            "mmengine=srvit_backbones.openmmlab.checkpoint_loading:allow_mmengine_checkpoints"],
    },
)
