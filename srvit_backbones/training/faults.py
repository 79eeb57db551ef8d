"""Fault handling shared by every training entry point, torch only (docs/faults.md)."""
import contextlib
import datetime
import os
from typing import Iterable, Optional

import torch

from ..errors import SRViTError

#: seconds a collective waits for a rank that does not answer (docs/faults.md)
COLLECTIVE_TIMEOUT_S = 600

#: GradScaler steps skipped in a row after which a run is stopped (2**16 halved 20 times: 2**-4)
MAX_CONSECUTIVE_SKIPPED_STEPS = 20


def collective_timeout(seconds: Optional[float] = None) -> datetime.timedelta:
    return datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S if seconds is None else seconds)


class Diverged(SRViTError, FloatingPointError):
    """A run stopped because it diverged (``divergence_message``)."""


class CheckpointWriteError(SRViTError, OSError):
    """A checkpoint that could not be written: its file, the cause, and what is left on disk."""


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb"):
    """``open(path, mode)`` for writing, whole or not at all (``PATH.tmp``, flushed, renamed over ``path``).

    Args:
        path: the file to write.
        mode: ``open``'s writing mode ("wb", "w").
    Raises:
        CheckpointWriteError: a write failed (naming ``path`` and the cause); the temporary file is removed."""
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
    """The message that stops a diverged run: what, when, the last checkpoint and how to resume, what to try."""
    kept = (f"the last checkpoint, {last_checkpoint!r}, was written before it: {resume} continues from it"
            if last_checkpoint else "no checkpoint was written before it: the run restarts from its initial weights")
    return f"{what} at iteration {iteration}: training stopped; {kept}. Try: " + "; ".join(fixes) + "."


def refuse_non_finite_weights(state_dict, iteration: int, last_checkpoint: Optional[str], resume: str,
                              fixes: Iterable[str]) -> None:
    """Raise ``Diverged`` instead of saving weights that are not finite (one device sync per device)."""
    names = [name for name, value in state_dict.items() if torch.is_tensor(value) and value.is_floating_point()]
    flags = [torch.isfinite(state_dict[name]).all() for name in names]
    if len({flag.device for flag in flags}) > 1:
        flags = [flag.cpu() for flag in flags]
    bad = [name for name, ok in zip(names, torch.stack(flags).tolist()) if not ok] if flags else []
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise Diverged(divergence_message(f"the weights became non-finite ({shown}) and were not saved",
                                                    iteration, last_checkpoint, resume, fixes))


class SkippedStepCounter:
    """Counts the steps a ``GradScaler`` skipped in a row: ``start`` before training, ``update`` after each step."""

    def __init__(self, limit: int = MAX_CONSECUTIVE_SKIPPED_STEPS):
        self.limit, self.consecutive, self.total = limit, 0, 0
        self._scale = self._last_skipped_at = None

    def start(self, scaler) -> "SkippedStepCounter":
        """Record the scale the next step starts from; returns self."""
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
        self._last_skipped_at = self._scale if skipped else self._last_skipped_at
        self._scale = scale
        return self.consecutive > self.limit

    def describe(self, scale_name: str = "the GradScaler") -> str:
        return (f"{scale_name} skipped {self.consecutive} optimizer steps in a row (non-finite gradients at every "
                f"scale down to {self._last_skipped_at:g}; {self.total} skipped in all), more than the {self.limit} "
                f"allowed")

