"""What every test gets, whichever file it is in."""
import sys

import pytest


@pytest.fixture(autouse=True)
def forget_mmengine_visualizers():
    """mmdet's and mmseg's configs name their Visualizer 'visualizer', and mmengine keeps one
    instance per name for the whole process: a Runner built by a later test would get the first
    test's instance and write its config and scalars into that test's work dir, which pytest
    removes once the test passes (pytest.ini's tmp_path_retention_policy). After each test the
    instances are forgotten, so each test's Runner draws and logs into its own work dir."""
    yield
    visualization = sys.modules.get("mmengine.visualization")
    if visualization is None:
        return
    classes = [visualization.Visualizer]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        cls._instance_dict.clear()
