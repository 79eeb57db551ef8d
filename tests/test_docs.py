"""Every command in the README and docs/ names files that exist and flags the tool accepts:
a renamed tool, config or option shows here before a user copies a stale command."""
import functools
import glob
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
CONFIG_DIRS = ("detectron2_configs", "mmdet_configs", "mmseg_configs")


def commands(page):
    """The shell commands of a page's ```bash blocks, continuation lines joined, comments dropped."""
    text = open(page).read()
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split(" #")[0].strip()
            if command:
                yield command


ALL = [(os.path.relpath(page, ROOT), command) for page in PAGES for command in commands(page)]


def unbracketed(word):
    """A word of a command, with the brackets that mark it optional (``[--tta]``) removed."""
    return word[1:-1] if word.startswith("[") and word.endswith("]") else word


def documented_arguments(command, tool):
    """The arguments a documented command passes to ``tool`` (a script, or a module run with
    ``python -m``): the words after it."""
    words = [unbracketed(w) for w in shlex.split(command)]
    return words[words.index(tool) + 1:]


# Runs each tool (a script's path, or "-m MODULE") until it parses its command line, keeps the
# parser it built (the first ArgumentParser asked to parse), and parses each documented argument
# list with it; prints, as the last line, JSON: per tool, per argument list, argparse's error or
# null, or the tool's own error where it could not be run to its parsing. A tool that finishes
# without parsing a command line accepts no arguments. One process for every tool: they share
# one import of torch and the frameworks.
PARSE_DOCUMENTED = r"""
import argparse, contextlib, io, json, runpy, sys, traceback

documented = json.loads(sys.argv[1])


class ParserBuilt(Exception):
    pass


parse_known_args = argparse.ArgumentParser.parse_known_args


def parser_of(target):
    parsers = []

    def keep_parser(self, args=None, namespace=None):
        parsers.append(self)
        raise ParserBuilt

    argparse.ArgumentParser.parse_known_args = keep_parser
    sys.argv = [target]
    try:
        if target.startswith("-m "):
            runpy.run_module(target[3:], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except ParserBuilt:
        pass
    finally:
        argparse.ArgumentParser.parse_known_args = parse_known_args
    return parsers[0] if parsers else None


def errors_of(target, argvs):
    try:
        parser = parser_of(target)
    except BaseException:
        return "could not be run to its argument parsing: " + traceback.format_exc()[-2000:]
    errors = []
    for argv in argvs:
        stderr = io.StringIO()
        try:
            if parser is None:
                raise SystemExit(print("it parses no command line: arguments " + repr(argv), file=stderr))
            with contextlib.redirect_stderr(stderr):
                parser.parse_args(argv)
            errors.append(None)
        except SystemExit:
            errors.append(stderr.getvalue().strip().splitlines()[-1])
    return errors


print(json.dumps({target: errors_of(target, argvs) for target, argvs in documented.items()}))
"""


ANALYZE_MODEL = "/tools/analyze_model.py"  # detectron2's, run from a detectron2 checkout
MIM_TOOLS = "/.mim/tools/"  # PACKAGE/.mim/tools/...: an OpenMMLab package's own tools, as pip installs them
FLOP_TOOL = ["python", "-m", "srvit_backbones.analysis.flops"]  # runs a framework's own tool, fused attention counted


def is_framework_tool(tool):
    return tool.startswith("mim run ") or tool.endswith(ANALYZE_MODEL) or MIM_TOOLS in tool


def tool_of(command):
    """The tools/ script a command runs, "-m MODULE" for ``python -m``, "mim run PACKAGE SCRIPT"
    or the script's path (as the command names it: detectron2's analyze_model.py, an OpenMMLab
    package's .mim tool, also when ``python -m srvit_backbones.analysis.flops`` runs it) for the frameworks'
    own tools, else None."""
    words = shlex.split(command)
    if words[:3] == FLOP_TOOL:
        return words[3]
    if words[:2] == ["python", "-m"]:
        return "-m " + words[2]
    if words[:2] == ["mim", "run"]:
        return " ".join(words[:4])
    return next((w for w in words if w.endswith(ANALYZE_MODEL) or w.startswith("tools/") and w.endswith(".py")), None)


@functools.lru_cache(maxsize=None)
def framework_tool(tool):
    """The file a framework's own tool runs from, None where it is not installed: mim's SCRIPT.py
    under PACKAGE/.mim/tools/; detectron2's tools/ beside the detectron2 package (a checkout
    installed in place, or the PyPI snapshot sal-detectron2, which installs it there)."""
    if tool.startswith("mim run "):
        package, script = tool.split()[2:4]
        root = os.path.join(os.path.dirname(importlib.util.find_spec(package).origin), ".mim", "tools")
        found = glob.glob(os.path.join(root, "**", script + ".py"), recursive=True)
    elif MIM_TOOLS in tool:
        package, path = tool.split("/", 1)
        spec = importlib.util.find_spec(package.lower())
        found = [p for p in [spec and os.path.join(os.path.dirname(spec.origin), path)] if p and os.path.isfile(p)]
    else:
        checkout = os.path.dirname(os.path.dirname(importlib.util.find_spec("detectron2").origin))
        found = [p for p in [checkout + ANALYZE_MODEL] if os.path.isfile(p)]
    return found[0] if found else None


def target_of(tool):
    if is_framework_tool(tool):
        return framework_tool(tool)
    return tool if tool.startswith("-m ") else os.path.join(ROOT, tool)


@functools.lru_cache(maxsize=None)
def every_parse_error():
    """{tool: {documented arguments: argparse's error or None}} for every documented command that
    passes a tool arguments, parsed by the parser the tool builds (all tools in one process)."""
    argvs = {}
    for _, command in ALL:
        tool = tool_of(command)
        if tool is not None:
            argvs.setdefault(tool, set()).add(tuple(documented_arguments(command, tool.split()[-1])))
    argvs = {tool: sorted(a - {()}) for tool, a in argvs.items() if a - {()} and target_of(tool) is not None}
    proc = subprocess.run([sys.executable, "-c", PARSE_DOCUMENTED,
                           json.dumps({target_of(t): a for t, a in argvs.items()})],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    return {tool: results[target_of(tool)] for tool in argvs}


def parse_errors(tool):
    """{documented arguments: argparse's error or None} for the tool's documented commands."""
    errors = every_parse_error()[tool]
    assert not isinstance(errors, str), f"{tool} {errors}"
    argvs = sorted({tuple(documented_arguments(c, tool.split()[-1])) for _, c in ALL if tool_of(c) == tool} - {()})
    return dict(zip(argvs, errors, strict=True))


def assert_tool_accepts(page, command, tool):
    """The tool's own parser accepts the documented arguments: its options, their values and
    its positional arguments (a command without arguments has nothing to parse)."""
    argv = tuple(documented_arguments(command, tool.split()[-1]))
    if argv:
        error = parse_errors(tool)[argv]
        assert error is None, f"{page}: {tool} does not accept {command!r}: {error}"


@functools.lru_cache(maxsize=None)
def make_targets():
    return set(re.findall(r"^([\w-]+):", open(os.path.join(ROOT, "Makefile")).read(), flags=re.M))


def shipped_config(name):
    return any(glob.glob(os.path.join(ROOT, d, "**", name), recursive=True) for d in CONFIG_DIRS)


def test_the_pages_have_commands():
    pages = {page for page, _ in ALL}
    assert {"README.md", "docs/detectron2.md", "docs/mmdet.md", "docs/mmseg.md", "docs/pretraining.md",
            "docs/tools.md"} <= pages


@pytest.mark.parametrize("page,command", ALL, ids=[f"{p}:{c[:60]}" for p, c in ALL])
def test_command_names_existing_files_and_flags(page, command):
    words = [w for w in shlex.split(command) if "=" not in w.split("/")[0] or w.startswith("-")]
    if words[0] == "make":
        assert words[1] in make_targets(), f"{page}: no make target {words[1]!r}"
        return
    scripts = [w for w in words if w.startswith("tools/") and w.endswith(".py")]
    for word in words:
        if word.endswith(".py") and word.split("/")[0] in CONFIG_DIRS:
            assert os.path.isfile(os.path.join(ROOT, word)), f"{page}: {word} does not exist"
        elif word.endswith(".py") and "/" not in word and word.startswith(("mask_rcnn", "upernet")):
            assert shipped_config(word), f"{page}: no shipped config named {word}"
    if words[:2] == ["python", "-m"]:
        module = words[2]
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin.startswith(ROOT), f"{page}: no module {module} in the checkout"
        if words[:3] != FLOP_TOOL:
            assert_tool_accepts(page, command, tool_of(command))
            return
    tool = tool_of(command)
    if tool is not None and is_framework_tool(tool):
        if framework_tool(tool) is None:
            pytest.skip(f"{tool} is not installed here")
        assert_tool_accepts(page, command, tool)
        return
    if words[0] == "mim":
        assert words[1] in ("train", "test") and words[2] in ("mmdet", "mmseg"), command
        return
    assert scripts, f"{page}: {command!r} runs no tools/ script, make target, module or mim"
    script = scripts[0]
    assert os.path.isfile(os.path.join(ROOT, script)), f"{page}: {script} does not exist"
    assert_tool_accepts(page, command, script)
