"""Faults of a detectron2 run, handled as ``training.faults`` does (docs/faults.md)."""
import contextlib

from detectron2.engine import HookBase
from detectron2.engine import launch as detectron2_launch
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from ..errors import SRViTError
from ..training.faults import (
    MAX_CONSECUTIVE_SKIPPED_STEPS,
    Diverged,
    SkippedStepCounter,
    collective_timeout,
    divergence_message,
)

FIXES = ("a lower optimizer.lr (or a longer lr_multiplier.warmup_length)",
         "gradient clipping (detectron2.solver.build.maybe_add_gradient_clipping)",
         "fp32: train.amp.enabled=False")


class DivergenceCheck(HookBase):
    """Stops training once the GradScaler skipped too many steps; register it before the PeriodicCheckpointer."""

    def __init__(self, checkpointer, max_consecutive_skipped_steps: int = MAX_CONSECUTIVE_SKIPPED_STEPS):
        self.checkpointer = checkpointer
        self.skipped = SkippedStepCounter(max_consecutive_skipped_steps)

    def before_train(self):
        self.skipped.start(getattr(self.trainer, "grad_scaler", None))

    def after_step(self):
        if self.skipped.update(getattr(self.trainer, "grad_scaler", None)):
            raise Diverged(divergence_message(self.skipped.describe("the AMPTrainer's GradScaler"), self.trainer.iter,
                                              last_checkpoint(self.checkpointer), "--resume", FIXES))


def last_checkpoint(checkpointer):
    """The file ``last_checkpoint`` names in the output folder, or None."""
    return checkpointer.get_checkpoint_file() if checkpointer.has_checkpoint() else None


@contextlib.contextmanager
def explained_divergence(trainer):
    """Re-raise detectron2's own FloatingPointError as ``Diverged``, with the last checkpoint and what to try."""
    try:
        yield
    except FloatingPointError as e:
        if isinstance(e, Diverged):
            raise
        raise Diverged(divergence_message(f"the run diverged ({str(e).strip()})", trainer.iter,
                                          last_checkpoint(trainer.checkpointer), "--resume", FIXES)) from e


def launch(main, args) -> None:
    """detectron2's ``launch`` with the collective timeout; a dead process is an ``SRViTError`` naming its rank."""
    try:
        detectron2_launch(main, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
                          dist_url=args.dist_url, args=(args,), timeout=collective_timeout())
    except (ProcessExitedException, ProcessRaisedException) as e:
        where = f"rank {args.machine_rank * args.num_gpus + e.error_index} (process {e.error_pid} on machine " \
            f"{args.machine_rank})"
        if isinstance(e, ProcessRaisedException):
            raise SRViTError(f"{where} failed: the job is stopped; its error is above") from e
        how = f"was killed by signal {e.signal_name}" if e.signal_name else f"exited with code {e.exit_code}"
        raise SRViTError(f"{where} {how}: the job is stopped; continue it with --resume (the last complete "
                         f"checkpoint in train.output_dir)") from e

