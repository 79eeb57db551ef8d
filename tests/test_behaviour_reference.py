"""The core's behaviour pinned: features, dense intermediates and every parameter's gradient of
each registered variant (and windowed, padded-window, token-merging, hard-aggregation models and
bViT at two depths), in training mode with stochastic depth, against a reference recorded before
a restructuring. A change to the schedule of block applications, drop-path rates, windows,
relative-position tables or feature points shows here (``test_the_reference_catches``);
state-dict keys and shapes are pinned too, so old checkpoints keep loading.

Behaviour, not one CPU's arithmetic: the cases run in float64 and each tensor is kept as its
norm and its projections onto a few fixed random directions, compared within TOLERANCE of the
norm. Differently vectorised kernels (AVX2, AVX-512, none) and thread counts sum in other
orders, which moves float64 results by about 1e-13 of their norm; a change of behaviour moves
them by 1e-4 and more. ``test_the_reference_holds_on_another_cpu_path`` reruns the cases with
ATen's unvectorised kernels on one thread, so that a reference only one CPU reproduces cannot
come back. Every random draw is portable: float64 normals and uniforms (drop path's
``bernoulli_``) come from ATen's scalar generator on every x86 CPU.

Regenerate (only for an intended change of behaviour, saying why in the commit):
    SRVIT_WRITE_REFERENCE=1 python -m pytest tests/test_behaviour_reference.py
"""
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys

import pytest
import timm
import torch

import srvit_backbones  # noqa: F401  (registers the variants)
from srvit_backbones.models import VARIANTS, attention, srvit
from srvit_backbones.models.rel_pos import resize_rel_pos

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "behaviour_reference.json")
CASES = {name: (name, 32, dict(), None) for name in VARIANTS}
CASES.update({
    "srvit_s_t3_windowed_rel_pos": ("srvit_s_t3", 64, dict(window_size=2, use_rel_pos=True), None),
    "srvit_s_t3_padded_windows": ("srvit_s_t3", 64, dict(window_size=3, use_rel_pos=True), None),
    "srvit_s_t3_token_merging": ("srvit_s_t3", 64, dict(token_merge_ratio=0.5), None),
    "srvit_s_t3_hard": ("srvit_s_t3", 32, dict(aggregation="hard"), None),
    "bvit_s_6_steps": ("bvit_s", 32, dict(num_steps=6), None),
    "bvit_s_12_run_at_24": ("bvit_s", 32, dict(), 24),
    "bvit_s_windowed_run_at_6": ("bvit_s", 64, dict(window_size=2), 6),
})

#: random directions each tensor is projected onto
PROJECTIONS = 3
#: largest difference from the reference, as a fraction of the tensor's norm: float64 rounding
#: across CPU paths stays near 1e-13, the perturbations below move values by 1e-4 and more
TOLERANCE = 1e-9


@functools.lru_cache(maxsize=8)
def directions(numel: int) -> torch.Tensor:
    """(PROJECTIONS, numel) fixed directions of unit mean square: float64 normals from ATen's
    scalar generator (the same numbers on every CPU)."""
    return torch.randn(PROJECTIONS, numel, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def fingerprint(t: torch.Tensor) -> list:
    """[norm, projections onto ``directions`` / sqrt(numel)] (each projection at most the norm),
    to 12 significant digits."""
    flat = t.detach().to(torch.float64).flatten()
    projections = directions(flat.numel()) @ flat / flat.numel() ** 0.5
    return [float(f"{v:.12g}") for v in [flat.norm().item()] + projections.tolist()]


def write_reference(recorded: dict):
    """Indented JSON with each list of numbers on one line: a line per tensor."""
    text = json.dumps(recorded, indent=1, sort_keys=True)
    with open(REFERENCE, "w") as f:
        f.write(re.sub(r"\[\s+([-\d.e, \n]+?)\s+\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]",
                       text) + "\n")


def behaviour(name, size, options, run_at, perturb=None):
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=size, num_classes=7, drop_path_rate=0.2, **options).double()
    torch.manual_seed(2)  # the weights below do not depend on what building the model drew
    with torch.no_grad():  # every parameter non-zero: routers and step transforms take part
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, dtype=torch.float64).mul_(0.3 / max(1, p.shape[-1]) ** 0.5))
    if run_at:
        model.set_num_steps(run_at)
    if perturb:
        perturb(model)
    model.train()
    x = torch.randn(2, 3, size, size, dtype=torch.float64)
    torch.manual_seed(1)  # stochastic depth's draws
    features = model.forward_features(x)
    intermediates = model.forward_intermediates(x, intermediates_only=True)
    loss = features.square().mean() + sum(t.square().mean() for t in intermediates)
    loss.backward()
    return dict(state_dict={k: list(v.shape) for k, v in model.state_dict().items()},
                features=fingerprint(features), intermediates=[fingerprint(t) for t in intermediates],
                gradients={n: fingerprint(p.grad) for n, p in model.named_parameters() if p.grad is not None})


def differences(got: dict, expected: dict) -> list:
    """What in ``got`` is not ``expected``'s behaviour: one line per tensor off by more than
    TOLERANCE of its norm (with the relative error), or the state dict's keys and shapes."""
    if got["state_dict"] != expected["state_dict"]:
        return ["state-dict keys or shapes"]
    tensors = dict(features=(got["features"], expected["features"]))
    tensors.update({f"intermediate {i}": (g, e) for i, (g, e) in
                    enumerate(zip(got["intermediates"], expected["intermediates"]))})
    if len(got["intermediates"]) != len(expected["intermediates"]):
        return [f"{len(got['intermediates'])} intermediates instead of {len(expected['intermediates'])}"]
    if got["gradients"].keys() != expected["gradients"].keys():
        return ["the parameters that get a gradient"]
    tensors.update({f"gradient of {n}": (g, expected["gradients"][n]) for n, g in got["gradients"].items()})
    off = []
    for what, (g, e) in tensors.items():
        error = max(abs(a - b) for a, b in zip(g, e)) / max(e[0], 1e-300)
        if error > TOLERANCE:
            off.append(f"{what}: {error:.1e} of its norm")
    return off


@pytest.fixture(scope="module")
def reference():
    if os.environ.get("SRVIT_WRITE_REFERENCE"):
        return None
    with open(REFERENCE) as f:
        return json.load(f)


@pytest.mark.parametrize("case", CASES)
def test_behaviour_is_unchanged(case, reference):
    got = behaviour(*CASES[case])
    if reference is None:
        recorded = {}
        if os.path.exists(REFERENCE):
            with open(REFERENCE) as f:
                recorded = json.load(f)
        recorded[case] = got
        write_reference(recorded)
        pytest.skip("reference written")
    assert differences(got, reference[case]) == []


def test_the_reference_holds_on_another_cpu_path():
    """The cases again in a process on ATen's unvectorised kernels and one thread: another
    summation order than this process's (AVX2 or AVX-512, several threads) everywhere."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", OMP_NUM_THREADS="1")
    env.pop("SRVIT_WRITE_REFERENCE", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                           "-k", "test_behaviour_is_unchanged"], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(CASES)} passed" in proc.stdout


def _move_an_application(model):
    """Unit 1's first two blocks swap places: the same weights applied in another order."""
    blocks = model.units[1].blocks
    blocks[0], blocks[1] = blocks[1], blocks[0]


def _with_schedule_change(change):
    """A perturbation that builds the model from a schedule ``change`` altered."""
    def perturb(monkeypatch):
        build = srvit.build_schedule
        monkeypatch.setattr(srvit, "build_schedule", lambda *a, **k: change(build(*a, **k)))
    return perturb


def _one_rate_changed(schedule):
    apps = list(schedule.applications)
    apps[9] = dataclasses.replace(apps[9], drop_path_rate=apps[9].drop_path_rate + 0.02)
    return dataclasses.replace(schedule, applications=tuple(apps))


def _one_feature_point_moved(schedule):
    features = list(schedule.features)
    unit, _ = features[2]
    features[2] = (unit, 0)  # unit 2's first step instead of its mixture
    return dataclasses.replace(schedule, features=tuple(features))


def _windows_shifted(monkeypatch):
    """Every window one token to the right: the grid rolled before partitioning, back after."""
    window_qkv, merge_windows = attention.window_qkv, attention.merge_windows

    def shifted_qkv(qkv, bias, grid, window_size, num_heads):
        rolled = qkv.reshape(qkv.shape[0], *grid, -1).roll(1, dims=2).flatten(1, 2)
        return window_qkv(rolled, bias, grid, window_size, num_heads)

    def unshifted(x, grid, window_size):
        out = merge_windows(x, grid, window_size)
        return out.reshape(out.shape[0], *grid, -1).roll(-1, dims=2).flatten(1, 2)

    monkeypatch.setattr(attention, "window_qkv", shifted_qkv)
    monkeypatch.setattr(attention, "merge_windows", unshifted)


def _a_table_resized(model):
    """One block's window tables two rows longer (interpolated back at run time, as ViTDet does)."""
    attn = model.units[2].blocks[0].attn
    for name in ("window_rel_pos_h", "window_rel_pos_w"):
        table = getattr(attn, name)
        setattr(attn, name, torch.nn.Parameter(resize_rel_pos(table.detach(), table.shape[0] + 2)))


PERTURBATIONS = {  # what changes, in which case, applied to the model or through monkeypatch
    "an application moved": ("srvit_s_t3", _move_an_application, None),
    "a drop-path rate changed": ("srvit_s_t3", None, _with_schedule_change(_one_rate_changed)),
    "a feature point moved": ("srvit_s_t3", None, _with_schedule_change(_one_feature_point_moved)),
    "windows shifted by one token": ("srvit_s_t3_windowed_rel_pos", None, _windows_shifted),
    "a relative-position table resized": ("srvit_s_t3_windowed_rel_pos", _a_table_resized, None),
}


@pytest.mark.parametrize("change", PERTURBATIONS)
def test_the_reference_catches(change, reference, monkeypatch):
    """Each kind of behaviour change fails the comparison in the tensors' values (the state
    dict's shapes aside), by far more than TOLERANCE."""
    if reference is None:
        pytest.skip("writing the reference")
    case, on_model, patch = PERTURBATIONS[change]
    if patch:
        patch(monkeypatch)
    got = behaviour(*CASES[case], perturb=on_model)
    got["state_dict"] = reference[case]["state_dict"]  # values only: shapes are checked on their own
    off = differences(got, reference[case])
    assert off, f"{change} went unnoticed"
    assert max(float(line.rsplit(": ", 1)[1].split()[0]) for line in off) > 1e3 * TOLERANCE, off
