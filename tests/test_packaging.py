"""A regular (non-editable) install ships the configs and finds them through the package."""
import json
import os
import re
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
              for folder in ("", "analysis.", "analysis.benchmark.", "data.", "data.synthetic.", "pretrain.",
                             "training.")
              for name in sorted(os.listdir(os.path.join(package, *folder.split(".")))) if name.endswith(".py")]
    code = (f"import importlib; [importlib.import_module(m) for m in {shared!r}]; "
            "import sys, timm, torch, srvit_backbones, srvit_backbones.layer_decay, srvit_backbones.analysis.flops; "
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
    library aside); the checkpoint reader and the layer-decay rule import the core (and the
    errors) only; errors.py, the standard library only."""
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
        assert all(level == 1 and module.split(".")[0] in ("models", "errors") for level, module in relative), \
            (name, relative)
    for name in ("frameworks.py", "config_files.py", "errors.py"):  # the table, the errors: read first
        absolute, relative = _imports(os.path.join(ROOT, "srvit_backbones", name))
        assert sorted(m for m in absolute if m.split(".")[0] not in stdlib) == [], name
        assert relative <= {(1, "config_files")}, (name, relative)


#: where the package may exit: the tools' ``main`` (errors.tool_main) and the ``python -m`` /
#: console-script entry point's ``main`` and ``__main__`` block (collect_env)
EXITS = {"errors.py": "tool_main", "collect_env.py": "main"}


def _exits(tree, allowed):
    """(line, what) of each exit in a module's syntax tree outside the function ``allowed`` and
    its ``if __name__ == "__main__":`` block: ``SystemExit`` named (raised, caught, subclassed),
    ``sys.exit`` / ``os._exit`` / ``exit`` / ``quit`` called."""
    import ast

    skipped = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.FunctionDef) and node.name == allowed) or (
                allowed and isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)):
            skipped |= {id(inner) for inner in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Name) and node.id == "SystemExit" or \
                isinstance(node, ast.Attribute) and node.attr == "SystemExit":
            found.append((node.lineno, "SystemExit"))
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in ("sys.exit", "os._exit", "exit", "quit"):
                found.append((node.lineno, name))
    return found


def test_the_library_raises_and_only_entry_points_exit():
    """Library code raises the package's typed errors (``srvit_backbones.errors``) and never ends
    the process: a caller (a notebook, another tool) catches them. Only the tools' ``main``
    (``errors.tool_main``) and ``collect_env``'s entry point may exit."""
    import ast

    package = os.path.join(ROOT, "srvit_backbones")
    found = {}
    for path in _package_files(""):
        name = os.path.relpath(path, package)
        exits = _exits(ast.parse(open(path).read()), EXITS.get(name))
        if exits:
            found[name] = exits
    assert found == {}


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


# Snapshots every other package's modules (each module's attributes, the entries of its dict- and
# set-valued attributes and the attributes of the classes it defines, by identity) before and after
# importing every module of srvit_backbones, the frameworks imported first as a user's process has
# them; prints, as the last line, JSON: what changed, as "module: attribute", "module:
# attribute[entry]" or "module: Class.attribute". An attribute a new submodule adds to its package
# (the import system's doing) is not a change.
IMPORT_SNAPSHOT = r"""
import importlib, json, pkgutil, sys, types, warnings

warnings.simplefilter("ignore")
import detectron2.checkpoint, detectron2.engine, detectron2.evaluation, detectron2.modeling, detectron2.utils.analysis
import fvcore.nn, lvis, mmengine.analysis, mmengine.runner, timm, torch
import mmdet.utils, mmseg.utils

mmdet.utils.register_all_modules(init_default_scope=False)
mmseg.utils.register_all_modules(init_default_scope=False)


def snapshot():
    state = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("srvit_backbones", "__main__", "__mp_main__") or module is None:
            continue
        entries = state[name] = {}
        for attr, value in list(vars(module).items()):
            entries[attr] = value
            if type(value) in (dict, set):
                entries.update({f"{attr}[{key!r}]": value[key] if type(value) is dict else key for key in list(value)})
            if isinstance(value, type) and value.__module__ == name:
                entries.update({f"{attr}.{key}": v for key, v in list(vars(value).items())})
    return state


before = snapshot()
import srvit_backbones

for module in pkgutil.walk_packages(srvit_backbones.__path__, "srvit_backbones."):
    importlib.import_module(module.name)
after = snapshot()
missing = object()
print(json.dumps(sorted(
    f"{name}: {key}" for name, entries in before.items() for key in entries.keys() | after[name].keys()
    if entries.get(key, missing) is not after[name].get(key, missing)
    and not (key not in entries and isinstance(after[name][key], types.ModuleType)))))
"""


#: what importing us may change: the frameworks' registries (our entries, added by their public
#: registration calls), and the standard library's caches, which any import fills
REGISTRIES = [r"timm\.models\._registry: _model_\w+\[",  # timm's register_model
              r"timm\.layers\._fx: _autowrap_functions\[",  # timm's register_notrace_function, which calls
              r"torch\.fx\._symbolic_trace: _wrapped_fns_to_patch\[",  # torch.fx.wrap
              r"mmengine\.fileio\.(backends\.registry_utils|backends|io): backends\[",  # mmengine's register_backend
              # torch.serialization.add_safe_globals (openmmlab/checkpoint_loading.py: mmengine's checkpoints)
              r"torch\._weights_only_unpickler: _marked_safe_globals_set\b",
              r"re: _cache\[", r"sys: path_importer_cache\["]


def test_importing_the_package_changes_no_other_library():
    """Importing srvit_backbones and every module of it (the adapters, the modules the configs'
    custom_imports name) adds entries to the frameworks' registries and changes nothing else in
    any other package: no flop-handle table (fvcore's, mmengine's), no module attribute (lvis.eval's
    numpy), no function. A user's own models in the same process are counted and evaluated as
    without us."""
    out = subprocess.run([sys.executable, "-c", IMPORT_SNAPSHOT], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    changes = json.loads(out.stdout.splitlines()[-1])
    assert [c for c in changes if not any(re.match(p, c) for p in REGISTRIES)] == []
    assert any(c.startswith("timm.models._registry: _model_entrypoints['srvit_s_t3']") for c in changes)


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


def _simple_statements(function):
    """The simple statements (assignments, calls, returns...) of a function's body, nested ones
    included, each as normalised source; its docstring and bare ``return`` / ``pass`` left out."""
    import ast
    import inspect
    import textwrap

    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0].body
    except (OSError, TypeError, SyntaxError):  # a builtin, or source that is not there
        return []
    compound = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef, ast.AsyncWith)
    return [ast.unparse(node) for stmt in body for node in ast.walk(stmt) if isinstance(node, ast.stmt)
            and not isinstance(node, compound) and ast.unparse(node) not in ("return", "pass")
            and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]


def test_no_method_repeats_a_framework_methods_body():
    """No method of the package that overrides a framework's method repeats its body (four or more
    of its statements): a copy that the framework's next release silently leaves behind. An
    override calls the framework's method and adds to it."""
    import importlib
    import inspect
    import pkgutil

    import srvit_backbones

    modules = [importlib.import_module(m.name)
               for m in pkgutil.walk_packages(srvit_backbones.__path__, "srvit_backbones.")]
    copies = []
    for module in modules:
        for cls in [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]:
            for name, value in vars(cls).items():
                bases = [base for base in cls.__mro__[1:] if base.__module__.split(".")[0] in FRAMEWORKS
                         and name in vars(base)]
                if not bases or not inspect.isfunction(value):
                    continue
                theirs = set(_simple_statements(vars(bases[0])[name]))
                repeated = [line for line in _simple_statements(value) if line in theirs]
                if len(repeated) >= 4:
                    copies.append(f"{cls.__module__}.{cls.__qualname__}.{name} repeats {len(repeated)} statements "
                                  f"of {bases[0].__module__}.{bases[0].__qualname__}.{name}: {repeated}")
    assert copies == []


#: the modules at the top of the package, beside the folders that group the rest by purpose
TOP_LEVEL = {"checkpoint.py", "layer_decay.py", "frameworks.py", "config_files.py", "errors.py", "collect_env.py"}
FOLDERS = {"models", "detectron2", "openmmlab", "mmdet", "mmseg", "pretrain", "training", "data", "analysis"}


def _package_imports():
    """{module path: the package's modules it imports}, each import resolved to the module file it
    names (``from . import x`` of a module ``x`` included); imports of a package's ``__init__``
    (its face, which only hands names on) are left out."""
    import ast

    package = os.path.join(ROOT, "srvit_backbones")
    graph = {}
    for folder, _, files in os.walk(package):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            here = os.path.dirname(path)
            targets = set()
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ImportFrom) and (node.level
                                                         or (node.module or "").startswith("srvit_backbones")):
                    base = here if node.level else ROOT
                    for _ in range(node.level - 1):
                        base = os.path.dirname(base)
                    base = os.path.join(base, *node.module.split(".")) if node.module else base
                    for alias in node.names:
                        for candidate in (os.path.join(base, alias.name + ".py"), base + ".py"):
                            if os.path.isfile(candidate):
                                targets.add(candidate)
                                break
            graph[path] = targets
    return graph


def test_the_layout_groups_the_package_by_purpose_without_import_circles():
    """At most six loose modules at the top (the plugin's own: checkpoint reading, layer decay, the
    framework table, config files, errors, collect_env); the rest in folders named for what they
    are for; and no two modules importing each other, directly or around a circle."""
    package = os.path.join(ROOT, "srvit_backbones")
    entries = {name for name in os.listdir(package) if name != "__init__.py" and not name.startswith((".", "_"))}
    assert {name for name in entries if name.endswith(".py")} == TOP_LEVEL
    assert {name for name in entries if os.path.isdir(os.path.join(package, name))} == FOLDERS
    graph = _package_imports()
    state = {}

    def visit(path, stack):
        state[path] = "open"
        for target in graph[path]:
            assert state.get(target) != "open", "import circle: " + " -> ".join(
                os.path.relpath(p, package) for p in stack[stack.index(target):] + [target])
            if target not in state:
                visit(target, stack + [target])
        state[path] = "done"

    for path in sorted(graph):
        if path not in state:
            visit(path, [path])
