"""Every command in the README and docs/ names files that exist and flags the tool accepts:
a renamed tool, config or option shows here before a user copies a stale command."""
import functools
import glob
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


@functools.lru_cache(maxsize=None)
def tool_help(script):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, f"{script} --help failed:\n{proc.stderr[-2000:]}"
    return proc.stdout


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
        assert subprocess.run([sys.executable, "-c", f"import importlib.util as u; "
                               f"assert u.find_spec({module!r})"], cwd=ROOT).returncode == 0, module
        return
    if words[0] == "mim":
        assert words[1] in ("train", "test") and words[2] in ("mmdet", "mmseg"), command
        return
    assert scripts, f"{page}: {command!r} runs no tools/ script, make target, module or mim"
    script = scripts[0]
    assert os.path.isfile(os.path.join(ROOT, script)), f"{page}: {script} does not exist"
    accepted = tool_help(script)
    for flag in (w.split("=")[0] for w in words[words.index(script) + 1:] if w.startswith("--")):
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}([\s,=\]]|$)", accepted, flags=re.M), \
            f"{page}: {script} does not accept {flag} ({command})"
