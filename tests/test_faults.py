"""srvit_backbones.training.faults, what every training entry point does under a fault, in itself: a
checkpoint write killed mid-way, a GradScaler skipping step after step. The entry points' own
runs under each fault are tested in their files (test_detectron2, test_mmseg, test_mmdet,
test_pretrain: "diverged", "cut_short", "two_machines", "rank_killed")."""
import os
import signal
import subprocess
import sys

import pytest
import torch

from helpers import wait_for_text
from srvit_backbones.training import faults

# a process that rewrites CHECKPOINT through faults.atomic_open and is stopped half-way through
# the write (it prints "writing" and sleeps there, as a large checkpoint's write takes a while)
HALF_WRITTEN = """
import os, sys, time, types
package = types.ModuleType("srvit_backbones")  # the package's modules without its __init__: no timm to import
package.__path__ = [os.path.dirname(os.path.dirname(sys.argv[2]))]
sys.modules["srvit_backbones"] = package
from srvit_backbones.training import faults  # torch and srvit_backbones.errors only

with faults.atomic_open(sys.argv[1]) as f:
    f.write(b"new" * 100_000)
    f.flush()
    print("writing", flush=True)
    time.sleep(120)
    f.write(b"end")
"""


def test_a_checkpoint_write_killed_midway_leaves_the_previous_file(tmp_path):
    """SIGKILL while the new checkpoint is half on disk: the earlier file is whole and in place,
    and the only trace of the write is its temporary file, which nothing loads."""
    path = tmp_path / "last.pth"
    torch.save({"weights": torch.arange(10.0)}, path)
    before = path.read_bytes()
    log = tmp_path / "writer.log"
    writer = subprocess.Popen([sys.executable, "-c", HALF_WRITTEN, str(path), faults.__file__], stdout=open(log, "w"),
                              stderr=subprocess.STDOUT)
    try:
        wait_for_text(log, "writing", writer, timeout=120)
        os.kill(writer.pid, signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL
    finally:
        if writer.poll() is None:
            writer.kill()
    assert path.read_bytes() == before
    assert torch.equal(torch.load(path, weights_only=True)["weights"], torch.arange(10.0))
    assert os.path.getsize(f"{path}.tmp") == 300_000  # the cut-short write, beside it


def test_a_write_that_fails_names_the_file_and_keeps_the_previous_one(tmp_path):
    path = tmp_path / "model_final.pth"
    path.write_bytes(b"complete")

    with pytest.raises(faults.CheckpointWriteError, match=rf"'{path}' was not written: No space left on device"), \
            faults.atomic_open(str(path)) as f:
        f.write(b"partial")
        raise OSError(28, "No space left on device")
    assert path.read_bytes() == b"complete" and os.listdir(tmp_path) == ["model_final.pth"]


def scaled_steps(scaler, loss_of, steps, counter):
    """``steps`` optimizer steps of one parameter through ``scaler`` (a real GradScaler);
    the first step at which ``counter`` says stop, or None."""
    weight = torch.zeros(4, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    counter.start(scaler)  # the scale before the first step
    for step in range(steps):
        optimizer.zero_grad()
        scaler.scale(loss_of(weight)).backward()
        scaler.step(optimizer)
        scaler.update()
        if counter.update(scaler):
            return step
    return None


def test_a_grad_scaler_skipping_every_step_is_stopped_after_the_limit():
    """A finite loss whose gradient is infinite at every scale (sqrt at 0): torch's GradScaler
    skips each step and halves its scale, silently; the counter stops after 20 + 1 in a row."""
    counter = faults.SkippedStepCounter()
    stopped = scaled_steps(torch.amp.GradScaler("cpu"), lambda w: torch.sqrt(w).sum(), 100, counter)
    assert stopped == faults.MAX_CONSECUTIVE_SKIPPED_STEPS  # 0-based: the 21st skipped step
    assert counter.consecutive == counter.total == 21
    message = counter.describe()
    assert "skipped 21 optimizer steps in a row" in message and "more than the 20 allowed" in message
    assert "every scale down to 0.0625" in message  # the 21st skipped step's: 2**16 / 2**20


def test_a_grad_scaler_settling_its_scale_is_left_alone():
    """A gradient that overflows at the initial scale only (1e34 x 2**16 > float32's max): one
    skipped step, then steps are taken and the row is over: no stop."""
    counter = faults.SkippedStepCounter(limit=1)  # a second skip in a row would stop
    assert scaled_steps(torch.amp.GradScaler("cpu"), lambda w: (w * 1e34).sum(), 30, counter) is None
    assert counter.total == 1 and counter.consecutive == 0
