"""Helpers shared by the test files (importable because pytest puts tests/ on sys.path)."""
import importlib.util
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_tool(name: str):
    """``tools/<name>.py`` as a fresh module: the tools are scripts, run the way users run them,
    not a package."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def randomize_routers(model, std: float = 0.3):
    """The model with its routers and step transforms drawn at random, standing in for trained
    weights: zero-initialised ones mix every step uniformly, which would hide a wrongly ordered
    mixture."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".router." in name or ".step_transforms." in name:
                p.normal_(0, std)
    return model
