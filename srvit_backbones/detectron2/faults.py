"""A diverged detectron2 run stopped with the message every entry point gives
(``faults.divergence_message``): detectron2 stops at a non-finite loss itself ("Loss became
infinite or NaN at iteration=N", main process) but names neither the last checkpoint nor a fix,
and its ``AMPTrainer`` lets a GradScaler skip every step silently."""
import contextlib

from detectron2.engine import HookBase

from ..faults import MAX_CONSECUTIVE_SKIPPED_STEPS, Diverged, SkippedStepCounter, divergence_message

FIXES = ("a lower optimizer.lr (or a longer lr_multiplier.warmup_length)",
         "gradient clipping (detectron2.solver.build.maybe_add_gradient_clipping)",
         "fp32: train.amp.enabled=False")


class DivergenceCheck(HookBase):
    """Stops training (``faults.Diverged``) once the ``AMPTrainer``'s GradScaler has skipped more
    than ``max_consecutive_skipped_steps`` optimizer steps in a row; a trainer without one is
    left alone. Register it before the PeriodicCheckpointer, so that a checkpoint is never
    written after such a step."""

    def __init__(self, checkpointer, max_consecutive_skipped_steps: int = MAX_CONSECUTIVE_SKIPPED_STEPS):
        self.checkpointer = checkpointer
        self.skipped = SkippedStepCounter(max_consecutive_skipped_steps)

    def after_step(self):
        if self.skipped.update(getattr(self.trainer, "grad_scaler", None)):
            raise Diverged(divergence_message(self.skipped.describe("the AMPTrainer's GradScaler"),
                                                        self.trainer.iter, last_checkpoint(self.checkpointer),
                                                        "--resume", FIXES))


def last_checkpoint(checkpointer):
    """The file ``last_checkpoint`` names in the output folder, or None."""
    return checkpointer.get_checkpoint_file() if checkpointer.has_checkpoint() else None


@contextlib.contextmanager
def explained_divergence(trainer):
    """Re-raises the FloatingPointError of detectron2's own divergence checks (a non-finite loss;
    non-finite predicted boxes in the ROI heads) with the iteration, the last checkpoint (of
    ``trainer.checkpointer``, as detectron2's DefaultTrainer holds it) and what to try."""
    try:
        yield
    except FloatingPointError as e:
        if isinstance(e, Diverged):
            raise
        raise Diverged(divergence_message(f"the run diverged ({str(e).strip()})", trainer.iter,
                                          last_checkpoint(trainer.checkpointer), "--resume", FIXES)) from e
