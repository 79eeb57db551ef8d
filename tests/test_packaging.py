"""A regular (non-editable) install ships the configs and finds them through the package."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_wheel_install_finds_shipped_configs(tmp_path):
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "wheel"), ROOT],
                   check=True, cwd=str(tmp_path))
    wheel = next((tmp_path / "wheel").glob("srvit_backbones-*.whl"))
    subprocess.run(pip + ["install", "--no-deps", "-q", "--target", str(tmp_path / "site"), str(wheel)], check=True)
    code = ("import srvit_backbones as s; print(s.__file__); "
            "print(s.config_path('detectron2', 'mask_rcnn_srvit_s_t3.py')); "
            "print(s.config_path('mmseg', 'upernet_srvit_s.py')); print(len(s.list_configs('mmseg'))); "
            "print(s.config_path('mmdet', 'mask_rcnn_srvit_s_t3_lsj.py'))")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                         check=True).stdout.split()
    site = str(tmp_path / "site")
    assert out[0].startswith(site)  # the installed copy, not the source tree
    assert out[1] == os.path.join(site, "srvit_backbones", "_configs", "detectron2_configs", "mask_rcnn_srvit_s_t3.py")
    assert out[2].startswith(site) and os.path.isfile(out[2]) and int(out[3]) >= 8
    assert os.path.isfile(os.path.join(site, "srvit_backbones", "_configs", "mmseg_configs", "_base_",
                                       "upernet_srvit_mln_160k_ade20k.py"))
    assert out[4] == os.path.join(site, "srvit_backbones", "_configs", "mmdet_configs", "mask_rcnn_srvit_s_t3_lsj.py")
    assert os.path.isfile(os.path.join(site, "srvit_backbones", "_configs", "mmdet_configs", "_base_",
                                       "mask_rcnn_srvit_sfp_lsj_270k_coco.py"))


def test_the_core_imports_no_framework():
    """Importing the package, and every module outside the adapters' folders, and building,
    loading and counting a model loads neither a framework nor an adapter: each adapter registers
    itself only when imported."""
    package = os.path.join(ROOT, "srvit_backbones")
    shared = [f"srvit_backbones.{folder}{name[:-3]}".replace(".__init__", "")
              for folder in ("", "benchmark.", "pretrain.", "synthetic.")
              for name in sorted(os.listdir(os.path.join(package, folder.rstrip(".")))) if name.endswith(".py")]
    code = (f"import importlib; [importlib.import_module(m) for m in {shared!r}]; "
            "import sys, timm, torch, srvit_backbones, srvit_backbones.layer_decay, srvit_backbones.flops; "
            "m = timm.create_model('srvit_t_t2', embed_dim=32, num_heads=2); "
            "srvit_backbones.load_pretrained(m, m.state_dict()); "
            "print(sorted(n for n in sys.modules if n.split('.')[0] in "
            "('detectron2', 'mmseg', 'mmdet', 'mmengine', 'mmcv') or n.startswith(('srvit_backbones.detectron2', "
            "'srvit_backbones.mmseg', 'srvit_backbones.mmdet', 'srvit_backbones.openmmlab'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _imports(path):
    """(module names imported absolutely, relative imports as (level, module)) of a source file,
    also those inside functions."""
    import ast

    absolute, relative = set(), set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            absolute |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                relative.add((node.level, node.module or ""))
            else:
                absolute.add(node.module)
    return absolute, relative


def _package_files(*folders):
    for folder in folders:
        for dirpath, _, names in os.walk(os.path.join(ROOT, "srvit_backbones", folder)):
            yield from (os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".py"))


def test_imports_point_one_way():
    """models/ (torch + timm) <- checkpoint.py, layer_decay.py <- adapters <- tools: the core
    imports nothing of the package and no third-party module but torch and timm (the standard
    library aside); the checkpoint reader and the layer-decay rule import the core only."""
    stdlib = set(sys.stdlib_module_names)
    for path in _package_files("models"):
        absolute, relative = _imports(path)
        outside = sorted(m for m in absolute if m.split(".")[0] not in stdlib | {"torch", "timm"})
        assert outside == [], f"{path} imports {outside}"
        assert all(level == 1 for level, _ in relative), f"{path} imports from outside models/: {relative}"
    for name in ("checkpoint.py", "layer_decay.py"):
        absolute, relative = _imports(os.path.join(ROOT, "srvit_backbones", name))
        third_party = sorted(m for m in absolute if m.split(".")[0] not in stdlib | {"torch", "timm", "safetensors"})
        assert third_party == [], f"{name} imports {third_party}"
        assert all(level == 1 and module.split(".")[0] in ("models",) for level, module in relative), (name, relative)
    for name in ("frameworks.py", "config_files.py"):  # the framework table: read before any framework
        absolute, relative = _imports(os.path.join(ROOT, "srvit_backbones", name))
        assert sorted(m for m in absolute if m.split(".")[0] not in stdlib) == [], name
        assert relative <= {(1, "config_files")}, (name, relative)


def _tools():
    folder = os.path.join(ROOT, "tools")
    return {name: os.path.join(folder, name) for name in sorted(os.listdir(folder))
            if os.path.isfile(os.path.join(folder, name))}


def test_tools_are_entry_points():
    """A tool parses arguments, calls the package and prints: none is over 150 lines (setup.sh
    aside), all of tools/ together at most 1,300."""
    lengths = {name: sum(1 for _ in open(path)) for name, path in _tools().items()}
    assert {name: n for name, n in lengths.items() if n > 150 and name != "setup.sh"} == {}
    assert sum(lengths.values()) <= 1300, lengths


def test_tools_find_frameworks_through_the_table():
    """No tool chooses a framework by its name (``if framework == "mmdet"``, a dict from the
    frameworks' names to functions): the tools that serve every framework go through
    ``srvit_backbones.frameworks``, so a framework registered there is served without editing tools/."""
    import ast

    from srvit_backbones.frameworks import frameworks

    names = set(frameworks())
    for tool, path in _tools().items():
        if not tool.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                constants = {o.value for o in operands if isinstance(o, ast.Constant)}
                constants |= {e.value for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set))
                              for e in o.elts if isinstance(e, ast.Constant)}
                assert not constants & names, f"tools/{tool}:{node.lineno} compares with a framework's name"
            if isinstance(node, ast.Dict):  # a dispatch table: the frameworks' names to functions or classes
                keys = {k.value for k, v in zip(node.keys, node.values)
                        if isinstance(k, ast.Constant) and isinstance(v, (ast.Name, ast.Attribute, ast.Lambda))}
                assert len(keys & names) < 2, f"tools/{tool}:{node.lineno} dispatches on the frameworks' names"


#: the frameworks whose private methods the package may not override
FRAMEWORKS = ("detectron2", "fvcore", "iopath", "mmengine", "mmcv", "mmdet", "mmseg", "torch", "timm")
#: the private methods a framework documents for its subclasses to override, or overrides in its own subclasses
OVERRIDABLE = {"_load_file", "_load_model",  # fvcore's Checkpointer (detectron2's DetectionCheckpointer)
               "_bbox_forward", "_mask_forward", "_refine_roi",  # mmdet's RoI heads (its cascade heads)
               "_load_weights_to_model"}  # mmengine's BaseInferencer documents it (mmdet's, mmseg's inferencers)


def test_no_private_method_of_a_framework_is_overridden():
    """No class of the package overrides a framework's private (underscore) method, its internals
    that change with its releases, but those of OVERRIDABLE: every module imported, the methods of
    each class of the package (a mixin's too) checked against the framework classes after it in the
    method resolution order of every class of the package (attributes that metaclasses set aside)."""
    import importlib
    import inspect
    import pkgutil

    import srvit_backbones

    modules = [importlib.import_module(m.name)
               for m in pkgutil.walk_packages(srvit_backbones.__path__, "srvit_backbones.")]
    classes = {cls for module in modules for cls in vars(module).values()
               if inspect.isclass(cls) and cls.__module__ == module.__name__}
    overrides = sorted({
        f"{own.__module__}.{own.__qualname__}.{name} overrides {base.__module__}.{base.__qualname__}'s"
        for cls in classes for i, own in enumerate(cls.__mro__) if own.__module__.split(".")[0] == "srvit_backbones"
        for name, value in vars(own).items() if name.startswith("_") and not name.endswith("__")
        and name not in OVERRIDABLE and (inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod,
                                                                                         property)))
        for base in cls.__mro__[i + 1:] if base.__module__.split(".")[0] in FRAMEWORKS and name in vars(base)})
    assert overrides == []
