"""Helpers shared by the test files (importable because pytest puts tests/ on sys.path)."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_tool(name: str):
    """``tools/<name>.py`` as a fresh module: the tools are scripts, run the way users run them,
    not a package."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
