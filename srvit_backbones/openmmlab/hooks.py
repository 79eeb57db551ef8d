"""mmengine hooks of the SR-ViT configs: fp16 DDP gradients, whole saves, diverged runs stopped (docs/faults.md)."""
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

ATOMIC_LOCAL_BACKEND = "srvit_atomic_local"


class Fp16CompressionHook(Hook):
    """torch's ``fp16_compress_hook`` on the runner's DDP model (detectron2's ``train.ddp.fp16_compression``)."""

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
    """mmengine's local backend writing through ``atomic_open``; removals held while ``held`` is a list."""

    held = written = None

    def put(self, obj: bytes, filepath) -> None:
        mkdir_or_exist(os.path.dirname(str(filepath)))
        with atomic_open(str(filepath)) as f:
            f.write(obj)
        if AtomicLocalBackend.held is not None:
            AtomicLocalBackend.held = [path for path in AtomicLocalBackend.held if path != filepath]
            AtomicLocalBackend.written = filepath

    def remove(self, filepath) -> None:
        if self.held is None:
            super().remove(filepath)
        else:
            self.held.append(filepath)

    def rmtree(self, dir_path) -> None:
        if self.held is None:
            super().rmtree(dir_path)
        else:
            self.held.append(dir_path)

    def remove_held(self) -> None:
        """Remove the paths held, and hold no more."""
        held, AtomicLocalBackend.held = self.held or [], None
        for path in held:
            if self.isdir(path):
                self.rmtree(path)
            else:
                self.remove(path)


register_backend(ATOMIC_LOCAL_BACKEND, AtomicLocalBackend)


class SRViTCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` (same arguments), safe against a fault while saving (docs/faults.md)."""

    def __init__(self, *args, out_dir=None, file_client_args=None, backend_args=None, **kwargs):
        if backend_args is None and file_client_args is None and "://" not in str(out_dir or ""):
            backend_args = dict(backend=ATOMIC_LOCAL_BACKEND)
        super().__init__(*args, out_dir=out_dir, file_client_args=file_client_args, backend_args=backend_args, **kwargs)

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
        """Removals inside the block done at its end; on an error kept, unless the last save completed."""
        backend = self.file_backend
        if not isinstance(backend, AtomicLocalBackend):
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
        """``faults.Diverged`` instead of saving non-finite weights, naming the file ``last_checkpoint`` names."""
        pointer = Path(runner.work_dir, "last_checkpoint")  # mmengine's last_ckpt names the one being saved
        last = pointer.read_text() if pointer.is_file() else None
        refuse_non_finite_weights(checkpoint["state_dict"], checkpoint["meta"]["iter"], last, "--resume",
                                  divergence_fixes(runner))

    def after_train(self, runner) -> None:
        if getattr(self, "best_ckpt_path_dict", None):  # a key that never improved has no file
            self.best_ckpt_path_dict = {key: path for key, path in self.best_ckpt_path_dict.items() if path}
        pattern = os.path.join(glob.escape(str(self.out_dir)), "*-*.pth")
        published = set(glob.glob(pattern))
        try:
            super().after_train(runner)
        except BaseException:
            if isinstance(self.file_backend, AtomicLocalBackend) and is_main_process():
                for path in set(glob.glob(pattern)) - published:
                    os.remove(path)
            raise


class DivergenceCheckHook(Hook):
    """Stops training (``faults.Diverged``) at a non-finite loss or too many skipped steps, before any save."""

    priority = "ABOVE_NORMAL"

    def __init__(self, max_consecutive_skipped_steps: int = MAX_CONSECUTIVE_SKIPPED_STEPS):
        self.skipped = SkippedStepCounter(max_consecutive_skipped_steps)

    def before_train(self, runner) -> None:
        self.skipped.start(getattr(runner.optim_wrapper, "loss_scaler", None))
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
        if scaler is not None and runner.optim_wrapper.should_update() and self.skipped.update(scaler):
            self._stop(runner, self.skipped.describe("the AmpOptimWrapper's GradScaler"))

    @staticmethod
    def _stop(runner, what: str) -> None:
        raise Diverged(divergence_message(what, runner.iter + 1, runner.message_hub.get_info("last_ckpt"), "--resume",
                                          divergence_fixes(runner)))


def divergence_fixes(runner):
    """What to try when ``runner``'s run diverges, in its config's keys."""
    fixes = ["a lower optim_wrapper.optimizer.lr (or a longer warmup in param_scheduler)",
             "gradient clipping: optim_wrapper.clip_grad=dict(max_norm=1.0)"]
    if isinstance(runner.optim_wrapper, AmpOptimWrapper):
        fixes.append("fp32: optim_wrapper.type=OptimWrapper (or bf16: optim_wrapper.dtype=bfloat16)")
    return fixes
