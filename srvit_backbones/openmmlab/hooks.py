"""mmengine hooks of the SR-ViT configs, registered in mmseg's and mmdet's ``HOOKS`` by
``srvit_backbones.mmseg`` / ``.mmdet`` (the configs' ``custom_imports``):

- ``Fp16CompressionHook``: gradients all-reduced in fp16 under DDP, detectron2's
  ``train.ddp.fp16_compression`` (ViTDet's recipe) for mmengine runners;
- ``SRViTCheckpointHook``: mmengine's ``CheckpointHook`` with every checkpoint and the
  ``last_checkpoint`` pointer written whole or not at all, and old checkpoints removed only once
  the new one is complete;
- ``DivergenceCheckHook``: stops a run whose loss went non-finite, or whose GradScaler skipped
  step after step, naming the iteration, the last checkpoint and what to try (mmengine logs
  ``loss: nan`` to the end otherwise).
"""
import os

import torch
from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend, register_backend
from mmengine.hooks import CheckpointHook, Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import AmpOptimWrapper
from mmengine.utils import mkdir_or_exist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel

from ..faults import (MAX_CONSECUTIVE_SKIPPED_STEPS, Diverged, SkippedStepCounter, atomic_write, atomic_write_text,
                      divergence_message, refuse_non_finite_weights)

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
    """mmengine's local file backend whose ``put`` (how ``Runner.save_checkpoint`` writes) goes
    to ``FILE.tmp`` and is renamed over ``FILE`` once complete (``faults.atomic_write``): a
    process killed mid-write, or a full disk, leaves no truncated checkpoint for ``--resume`` to
    find, and a failed write is an error naming the file and the cause."""

    def put(self, obj: bytes, filepath) -> None:
        mkdir_or_exist(os.path.dirname(str(filepath)))
        atomic_write(str(filepath), lambda f: f.write(obj))


register_backend(ATOMIC_LOCAL_BACKEND, AtomicLocalBackend)


class SRViTCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` (same arguments), made safe against a fault while saving:

    - checkpoints in a local ``out_dir`` are written with ``AtomicLocalBackend`` (to a temporary
      file, renamed once complete), unless ``backend_args`` names another backend;
    - mmengine removes the oldest kept checkpoint (``max_keep_ckpts``) before it writes the new
      one, so a write that fails would leave one complete checkpoint fewer (none with
      ``max_keep_ckpts=1``); here the old ones are removed after the new one is complete;
    - the ``last_checkpoint`` pointer, which ``--resume`` reads, is written once the checkpoint
      is complete, and atomically too (mmengine rewrites it in place: a full disk there leaves an
      empty pointer, on which ``--resume`` fails with " can not be found").

    Non-finite weights are not saved: the run stops instead (``faults.refuse_non_finite_weights``),
    so a checkpoint is never replaced by a diverged one.

    Not covered: ``save_best`` (mmengine removes the previous best file before writing the new
    one) and ``published_keys`` (published in place); no shipped config uses them.

    ``_save_checkpoint_with_step`` is mmengine 0.10's with these changes (it writes the pointer with
    ``open`` itself, which no argument reaches, so it is not called)."""

    def __init__(self, *args, out_dir=None, file_client_args=None, backend_args=None, **kwargs):
        if backend_args is None and file_client_args is None and "://" not in str(out_dir or ""):
            backend_args = dict(backend=ATOMIC_LOCAL_BACKEND)
        super().__init__(*args, out_dir=out_dir, file_client_args=file_client_args, backend_args=backend_args,
                         **kwargs)

    def _save_checkpoint_with_step(self, runner, step, meta):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        refuse_non_finite_weights(model.state_dict(), meta.get("iter", runner.iter), runner.message_hub.get_info(
            "last_ckpt"), "--resume", divergence_fixes(runner))
        outdated = self._keep(runner, step)
        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
        runner.message_hub.update_info("last_ckpt", self.last_ckpt)  # before saving, as mmengine: it is saved too
        runner.save_checkpoint(self.out_dir, ckpt_filename, self.file_client_args, save_optimizer=self.save_optimizer,
                               save_param_scheduler=self.save_param_scheduler, meta=meta, by_epoch=self.by_epoch,
                               backend_args=self.backend_args, **self.args)
        if not is_main_process():  # model-parallel saving gathers on every rank; one writes the files
            return
        atomic_write_text(os.path.join(runner.work_dir, "last_checkpoint"), self.last_ckpt)
        for path in outdated:
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):  # DeepSpeed saves a checkpoint as a folder
                self.file_backend.rmtree(path)

    def _keep(self, runner, step):
        """mmengine's ``max_keep_ckpts`` bookkeeping of ``step``; the paths of the checkpoints it
        drops (on the main process), to remove once the new one is complete."""
        if self.max_keep_ckpts <= 0 or (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            return []  # nothing kept, or a second save of this step (the best checkpoint's)
        outdated = []
        if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
            dropped = self.keep_ckpt_ids.popleft()
            if is_main_process():
                outdated.append(self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(dropped)))
        self.keep_ckpt_ids.append(step)
        runner.message_hub.update_info("keep_ckpt_ids", list(self.keep_ckpt_ids))
        return outdated


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
