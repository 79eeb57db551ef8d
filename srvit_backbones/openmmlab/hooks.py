"""mmengine hooks of the SR-ViT configs, registered in mmseg's and mmdet's ``HOOKS`` by
``srvit_backbones.mmseg`` / ``.mmdet`` (the configs' ``custom_imports``):

- ``Fp16CompressionHook``: gradients all-reduced in fp16 under DDP, detectron2's
  ``train.ddp.fp16_compression`` (ViTDet's recipe) for mmengine runners;
- ``SRViTCheckpointHook``: mmengine's ``CheckpointHook`` with checkpoints written whole or not
  at all, old ones removed only once the new one is complete, and the ``last_checkpoint`` pointer
  naming a complete one;
- ``DivergenceCheckHook``: stops a run whose loss went non-finite, or whose GradScaler skipped
  step after step, naming the iteration, the last checkpoint and what to try (mmengine logs
  ``loss: nan`` to the end otherwise).
"""
import contextlib
import glob
import os
from pathlib import Path

import torch
from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend, register_backend
from mmengine.hooks import CheckpointHook, Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import AmpOptimWrapper
from mmengine.utils import mkdir_or_exist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel

from ..training.faults import (
    MAX_CONSECUTIVE_SKIPPED_STEPS,
    Diverged,
    SkippedStepCounter,
    atomic_open,
    divergence_message,
    refuse_non_finite_weights,
)

#: the ``backend_args`` backend that ``SRViTCheckpointHook`` writes local checkpoints with
ATOMIC_LOCAL_BACKEND = "srvit_atomic_local"


class Fp16CompressionHook(Hook):
    """Registers torch's ``fp16_compress_hook`` on the runner's DDP model before training; a
    non-distributed run is left as it is. A wrapper that is not torch's DDP (FSDP, DeepSpeed)
    is an error rather than a silently uncompressed run."""

    def before_train(self, runner) -> None:
        model = runner.model
        if not is_model_wrapper(model):
            return
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(f"Fp16CompressionHook needs torch's DistributedDataParallel (mmengine's "
                            f"MMDistributedDataParallel); the model is wrapped in {type(model).__name__}: "
                            f"remove the hook from custom_hooks")
        model.register_comm_hook(state=None, hook=fp16_compress_hook)


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend for checkpoints: ``put`` (how ``Runner.save_checkpoint``
    writes) goes to ``FILE.tmp``, renamed over ``FILE`` once complete (``faults.atomic_open``), so a
    process killed mid-write, or a full disk, leaves no truncated checkpoint for ``--resume`` to
    find, and a failed write is an error naming the file and the cause.

    While ``AtomicLocalBackend.held`` is a list (``SRViTCheckpointHook.removals_held``; class-wide,
    as mmengine makes a backend for each use), ``remove`` / ``rmtree`` add their path to it instead
    of removing it, ``put`` takes a path it writes again out of it, and ``written`` is the last."""

    held = written = None

    def put(self, obj: bytes, filepath) -> None:
        mkdir_or_exist(os.path.dirname(str(filepath)))
        with atomic_open(str(filepath)) as f:
            f.write(obj)
        if AtomicLocalBackend.held is not None:  # removed, then written again: a best saved twice at one step
            AtomicLocalBackend.held = [path for path in AtomicLocalBackend.held if path != filepath]
            AtomicLocalBackend.written = filepath

    def remove(self, filepath) -> None:
        self.held.append(filepath) if self.held is not None else super().remove(filepath)

    def rmtree(self, dir_path) -> None:
        self.held.append(dir_path) if self.held is not None else super().rmtree(dir_path)

    def remove_held(self) -> None:
        """Remove the files and folders (DeepSpeed's checkpoints) held, and hold no more."""
        held, AtomicLocalBackend.held = self.held or [], None
        for path in held:
            self.rmtree(path) if self.isdir(path) else self.remove(path)


register_backend(ATOMIC_LOCAL_BACKEND, AtomicLocalBackend)


class SRViTCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` (same arguments), made safe against a fault while saving,
    through its public methods:

    - checkpoints in a local ``out_dir`` are written with ``AtomicLocalBackend`` (whole or not at
      all), unless ``backend_args`` names another backend;
    - mmengine removes the checkpoints a new one outdates (the oldest of ``max_keep_ckpts``, the
      previous best of ``save_best``) before it writes the new one, so a write that fails would
      leave one complete checkpoint fewer (none with ``max_keep_ckpts=1``): here the backend holds
      those removals until the hook method that saves returns;
    - mmengine rewrites the ``last_checkpoint`` pointer in place once the checkpoint is complete,
      and a full disk there leaves it cut (``--resume`` then fails: " can not be found"): where
      the hook method raises after its checkpoint was complete, the held removals are done (room
      on the disk) and the pointer is written again, whole, naming it;
    - non-finite weights are not saved: the run stops instead (``faults.refuse_non_finite_weights``);
    - ``after_train`` (``published_keys``): a ``save_best`` key that never improved has no best file
      (None), which mmengine's would publish, failing at the end of the run; a published file whose
      write fails is removed (mmengine writes it in place, with no backend to choose)."""

    def __init__(self, *args, out_dir=None, file_client_args=None, backend_args=None, **kwargs):
        if backend_args is None and file_client_args is None and "://" not in str(out_dir or ""):
            backend_args = dict(backend=ATOMIC_LOCAL_BACKEND)
        super().__init__(*args, out_dir=out_dir, file_client_args=file_client_args, backend_args=backend_args,
                         **kwargs)

    def after_train_iter(self, runner, *args, **kwargs) -> None:
        with self.removals_held(runner):
            super().after_train_iter(runner, *args, **kwargs)

    def after_train_epoch(self, runner) -> None:
        with self.removals_held(runner):
            super().after_train_epoch(runner)

    def after_val_epoch(self, runner, metrics) -> None:
        with self.removals_held(runner):
            super().after_val_epoch(runner, metrics)

    @contextlib.contextmanager
    def removals_held(self, runner):
        """The checkpoints mmengine removes inside the block (before it writes the new one) removed
        once it ends without an error; on an error, kept, unless the checkpoint mmengine saved last
        is complete (its pointer's write failed): then removed, and the pointer written again naming it."""
        backend = self.file_backend
        if not isinstance(backend, AtomicLocalBackend):  # another storage: mmengine's as it is
            yield
            return
        AtomicLocalBackend.held, AtomicLocalBackend.written = [], None
        try:
            yield
        except BaseException:
            if AtomicLocalBackend.written is not None and AtomicLocalBackend.written == self.last_ckpt:
                backend.remove_held()
                with atomic_open(os.path.join(runner.work_dir, "last_checkpoint"), "w") as f:
                    f.write(self.last_ckpt)
            raise
        else:
            backend.remove_held()
        finally:
            AtomicLocalBackend.held = AtomicLocalBackend.written = None

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        """Non-finite weights are not saved: ``faults.Diverged`` instead, naming the checkpoint
        ``last_checkpoint`` names (mmengine's ``last_ckpt`` already names the one being saved)."""
        refuse_non_finite_weights(checkpoint["state_dict"], checkpoint["meta"]["iter"], last_checkpoint(runner),
                                  "--resume", divergence_fixes(runner))

    def after_train(self, runner) -> None:
        if getattr(self, "best_ckpt_path_dict", None):  # a key that never improved: nothing to publish
            self.best_ckpt_path_dict = {key: path for key, path in self.best_ckpt_path_dict.items() if path}
        pattern = os.path.join(glob.escape(str(self.out_dir)), "*-*.pth")
        published = set(glob.glob(pattern))
        try:
            super().after_train(runner)
        except BaseException:
            if isinstance(self.file_backend, AtomicLocalBackend) and is_main_process():
                for path in set(glob.glob(pattern)) - published:  # cut short: mmengine writes it in place
                    os.remove(path)
            raise


def last_checkpoint(runner):
    """Returns the checkpoint ``runner``'s ``last_checkpoint`` pointer names (written once it is complete), or None."""
    pointer = os.path.join(runner.work_dir, "last_checkpoint")
    return Path(pointer).read_text() if os.path.isfile(pointer) else None


class DivergenceCheckHook(Hook):
    """Stops training (``faults.Diverged``, a FloatingPointError) after an iteration whose loss is not finite, or once
    an ``AmpOptimWrapper``'s GradScaler has skipped more than ``max_consecutive_skipped_steps``
    optimizer steps in a row. Runs before the ``CheckpointHook``, so a diverged iteration is
    never saved: the last checkpoint the message names holds finite weights. mmengine reads
    the loss every iteration already (its log buffers), so the check adds no device sync."""

    priority = "ABOVE_NORMAL"

    def __init__(self, max_consecutive_skipped_steps: int = MAX_CONSECUTIVE_SKIPPED_STEPS):
        self.skipped = SkippedStepCounter(max_consecutive_skipped_steps)

    def before_train(self, runner) -> None:
        self.skipped.start(getattr(runner.optim_wrapper, "loss_scaler", None))  # after a resume loaded it
        if getattr(runner.optim_wrapper, "_scale_update_param", None) is not None:
            runner.logger.warning(
                f"optim_wrapper.loss_scale={runner.optim_wrapper._scale_update_param!r} is a fixed loss scale: the "
                f"GradScaler never lowers it, so the steps it skips are not counted and do not stop the run; "
                f"loss_scale='dynamic' lets DivergenceCheckHook count them")

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        loss = (outputs or {}).get("loss")
        if loss is not None and not torch.isfinite(torch.as_tensor(loss)).all():
            self._stop(runner, f"the loss became {torch.as_tensor(loss).float().mean().item()}")
        scaler = getattr(runner.optim_wrapper, "loss_scaler", None)
        # with accumulative_counts=N the scaler steps (and may skip) every Nth iteration only
        if scaler is not None and runner.optim_wrapper.should_update() and self.skipped.update(scaler):
            self._stop(runner, self.skipped.describe("the AmpOptimWrapper's GradScaler"))

    @staticmethod
    def _stop(runner, what: str) -> None:
        raise Diverged(divergence_message(what, runner.iter + 1, runner.message_hub.get_info("last_ckpt"), "--resume",
                                          divergence_fixes(runner)))


def divergence_fixes(runner):
    """What to try when a run of ``runner`` diverges, in its config's keys."""
    fixes = ["a lower optim_wrapper.optimizer.lr (or a longer warmup in param_scheduler)",
             "gradient clipping: optim_wrapper.clip_grad=dict(max_norm=1.0)"]
    if isinstance(runner.optim_wrapper, AmpOptimWrapper):
        fixes.append("fp32: optim_wrapper.type=OptimWrapper (or bf16: optim_wrapper.dtype=bfloat16)")
    return fixes
