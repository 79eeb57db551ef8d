"""The core's behaviour pinned bit for bit: features, dense intermediates and every
parameter's gradient of each registered variant (and windowed, padded-window, token-merging,
hard-aggregation models and bViT at two depths), in training mode with stochastic depth,
against hashes recorded before a restructuring. A change to the schedule of block
applications, drop-path rates, windows, relative-position tables or feature points shows here;
state-dict keys and shapes are pinned too, so old checkpoints keep loading.

Regenerate (only for an intended change of behaviour, saying why in the commit):
    SRVIT_WRITE_REFERENCE=1 python -m pytest tests/test_behaviour_reference.py
"""
import hashlib
import json
import os

import pytest
import timm
import torch

import srvit_backbones  # noqa: F401  (registers the variants)
from srvit_backbones.models import VARIANTS

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


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:16]


def behaviour(name, size, options, run_at):
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=size, num_classes=7, drop_path_rate=0.2, **options)
    torch.manual_seed(2)  # the weights below do not depend on what building the model drew
    with torch.no_grad():  # every parameter non-zero: routers and step transforms take part
        for p in model.parameters():
            p.copy_(torch.randn(p.shape).mul_(0.3 / max(1, p.shape[-1]) ** 0.5))
    if run_at:
        model.set_num_steps(run_at)
    model.train()
    x = torch.randn(2, 3, size, size)
    torch.manual_seed(1)  # stochastic depth's draws
    features = model.forward_features(x)
    intermediates = model.forward_intermediates(x, intermediates_only=True)
    loss = features.square().mean() + sum(t.square().mean() for t in intermediates)
    loss.backward()
    return dict(state_dict={k: list(v.shape) for k, v in model.state_dict().items()},
                features=digest(features), intermediates=[digest(t) for t in intermediates],
                gradients={n: digest(p.grad) for n, p in model.named_parameters() if p.grad is not None})


@pytest.fixture(scope="module")
def reference():
    if os.environ.get("SRVIT_WRITE_REFERENCE"):
        return None
    with open(REFERENCE) as f:
        return json.load(f)


@pytest.fixture(autouse=True)
def one_thread():
    """Bit-for-bit needs one summation order: the thread count of a matmul can change it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", CASES)
def test_behaviour_is_unchanged(case, reference):
    got = behaviour(*CASES[case])
    if reference is None:
        recorded = {}
        if os.path.exists(REFERENCE):
            with open(REFERENCE) as f:
                recorded = json.load(f)
        recorded[case] = got
        with open(REFERENCE, "w") as f:
            json.dump(recorded, f, indent=1, sort_keys=True)
        pytest.skip("reference written")
    expected = reference[case]
    assert got["state_dict"] == expected["state_dict"]
    assert got["features"] == expected["features"]
    assert got["intermediates"] == expected["intermediates"]
    assert got["gradients"] == expected["gradients"]
