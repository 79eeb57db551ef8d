"""What every training entry point does when a run goes wrong, written once (torch only):
checkpoints written whole or not at all, the message that ends a diverged run, the count of
steps a GradScaler skipped, and the collective timeout of a distributed run.

The adapters (``detectron2.faults``, ``openmmlab.hooks``, ``pretrain``) call these from their
framework's own hooks; docs/faults.md has what each fault looks like and the measured figures.
"""
import contextlib
import datetime
import os
from typing import Iterable, List, Optional

import torch

from ..errors import SRViTError

#: How long a collective waits for a rank that does not answer before the process group fails
#: (torch's own default is 30 minutes for gloo, 10 for NCCL). Long enough for the slowest thing
#: ranks wait on each other for in our runs (a first step that compiles or benchmarks kernels,
#: rank 0 computing a COCO / LVIS metric while the others wait at the result broadcast), short
#: enough that a rank lost on another machine ends the job in minutes rather than half an hour.
#: A rank lost on the same machine ends the job sooner: torchrun's agent (or detectron2's
#: ``launch``) sees the process die and stops the others; gloo also fails at once on a closed
#: connection. mmengine configs may set another with ``env_cfg.dist_cfg.timeout`` (seconds).
COLLECTIVE_TIMEOUT_S = 600

#: GradScaler steps skipped in a row (an inf / NaN gradient each time, the scale halved each
#: time) after which a run is stopped: from the default initial scale 2**16, 20 halvings leave
#: 2**-4, where a gradient that still overflows fp16 is not an overflow but a divergence. The few
#: skips of a healthy run's first steps, while the scale settles, stay far below.
MAX_CONSECUTIVE_SKIPPED_STEPS = 20


def collective_timeout(seconds: Optional[float] = None) -> datetime.timedelta:
    return datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S if seconds is None else seconds)


class Diverged(SRViTError, FloatingPointError):
    """A run stopped because it diverged, with ``divergence_message``'s explanation (a
    FloatingPointError, as the frameworks' own divergence checks raise)."""


class CheckpointWriteError(SRViTError, OSError):
    """A checkpoint that could not be written: its file, the cause, and what is left on disk (an
    OSError, as the write's own error)."""


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb"):
    """``open(path, mode)`` for writing, whole or not at all: the block writes ``PATH.tmp``, which
    its end flushes to disk and renames over ``path``, so a process killed or a disk that fills
    mid-write leaves the earlier file (and every other checkpoint) as it was, never a truncated
    ``path``.

    Args:
        path: the file to write.
        mode: ``open``'s writing mode ("wb", "w").
    Raises:
        CheckpointWriteError: a write failed (naming ``path`` and the cause); the temporary file is removed.
    """
    tmp = f"{path}.tmp"
    try:
        with open(tmp, mode) as f:
            recorder = _ErrorRecordingFile(f)
            try:
                yield recorder
            except RuntimeError as e:  # torch.save's writer reports a failed write as "unexpected pos"
                if recorder.error is None:
                    raise
                raise recorder.error from e
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if not isinstance(e, (OSError, RuntimeError)):
            raise
        cause = f"{e.strerror} (errno {e.errno})" if isinstance(e, OSError) and e.strerror else str(e)
        raise CheckpointWriteError(
            getattr(e, "errno", None) or 0,
            f"checkpoint {path!r} was not written: {cause}. The checkpoints written before it are "
            f"complete and untouched; free disk space (or raise the file size limit) and resume") from e


class _ErrorRecordingFile:
    """A file whose first failed ``write`` (its OSError: the cause) is kept for the caller."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data):
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name):
        return getattr(self.file, name)


def atomic_torch_save(obj, path: str) -> None:
    """``torch.save(obj, path)`` through ``atomic_open``."""
    with atomic_open(path) as f:
        torch.save(obj, f)


def divergence_message(what: str, iteration: int, last_checkpoint: Optional[str], resume: str,
                       fixes: Iterable[str]) -> str:
    """The message that stops a run whose loss went non-finite (or whose GradScaler skipped
    step after step): ``what`` happened at ``iteration``, the last checkpoint written before it
    (all of them were written while the loss was finite) and how to resume from it, what to try."""
    kept = (f"the last checkpoint, {last_checkpoint!r}, was written before it: {resume} continues from it"
            if last_checkpoint else "no checkpoint was written before it: the run restarts from its initial weights")
    return f"{what} at iteration {iteration}: training stopped; {kept}. Try: " + "; ".join(fixes) + "."


def non_finite_tensors(state_dict) -> List[str]:
    """The names of ``state_dict``'s floating-point tensors holding a NaN or an infinity (one
    device sync for all of them)."""
    names = [name for name, value in state_dict.items() if torch.is_tensor(value) and value.is_floating_point()]
    if not names:
        return []
    flags = [torch.isfinite(state_dict[name]).all() for name in names]
    if len({flag.device for flag in flags}) > 1:  # a model split over devices: one sync per device
        flags = [flag.cpu() for flag in flags]
    finite = torch.stack(flags).tolist()
    return [name for name, ok in zip(names, finite) if not ok]


def refuse_non_finite_weights(state_dict, iteration: int, last_checkpoint: Optional[str], resume: str,
                              fixes: Iterable[str]) -> None:
    """Raise Diverged (``divergence_message``) instead of saving weights that are not
    finite: an optimizer step can poison the weights while the loss it came from was finite (the
    loss check stops the run one iteration later), and such a checkpoint would replace a good one."""
    bad = non_finite_tensors(state_dict)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise Diverged(divergence_message(f"the weights became non-finite ({shown}) and were not saved",
                                                    iteration, last_checkpoint, resume, fixes))


class SkippedStepCounter:
    """Counts the optimizer steps a ``torch.amp.GradScaler`` skipped in a row (found inf / NaN
    gradients, halved its scale) and says when there were more than ``limit``. ``start`` reads
    the scale the first step starts from (call it before training, after a resume loaded the
    scaler's state: without it the first step's skip is not seen); ``update`` reads the scale
    after each step (after the scaler's ``update()``); a step whose scale did not drop (taken,
    or grown after ``growth_interval`` taken steps) ends the row."""

    def __init__(self, limit: int = MAX_CONSECUTIVE_SKIPPED_STEPS):
        self.limit = limit
        self.consecutive = 0
        self.total = 0
        self._scale = None
        self._last_skipped_at = None  # the scale the last skipped step ran at

    def start(self, scaler) -> "SkippedStepCounter":
        """Record the scale ``scaler`` (or None) starts the next step from; returns self."""
        self._scale = scaler.get_scale() if scaler is not None and scaler.is_enabled() else None
        return self

    def update(self, scaler) -> bool:
        """Record one step of ``scaler``; True once more than ``limit`` steps in a row were skipped."""
        if scaler is None or not scaler.is_enabled():
            return False
        scale = scaler.get_scale()
        skipped = self._scale is not None and scale < self._scale
        self.consecutive = self.consecutive + 1 if skipped else 0
        self.total += int(skipped)
        if skipped:
            self._last_skipped_at = self._scale
        self._scale = scale
        return self.consecutive > self.limit

    def describe(self, scale_name: str = "the GradScaler") -> str:
        return (f"{scale_name} skipped {self.consecutive} optimizer steps in a row (non-finite gradients at every "
                f"scale down to {self._last_skipped_at:g}; {self.total} skipped in all), more than the {self.limit} "
                f"allowed")

