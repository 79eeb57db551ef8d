"""mmengine hooks of the SR-ViT configs, registered in mmseg's and mmdet's ``HOOKS`` by
``srvit_backbones.mmseg`` / ``.mmdet`` (the configs' ``custom_imports``):

- ``Fp16CompressionHook``: gradients all-reduced in fp16 under DDP, detectron2's
  ``train.ddp.fp16_compression`` (ViTDet's recipe) for mmengine runners;
- ``SRViTCheckpointHook``: mmengine's ``CheckpointHook`` with every checkpoint (the best and
  the published ones too) and the ``last_checkpoint`` pointer written whole or not at all, and
  old checkpoints removed only once the new one is complete;
- ``DivergenceCheckHook``: stops a run whose loss went non-finite, or whose GradScaler skipped
  step after step, naming the iteration, the last checkpoint and what to try (mmengine logs
  ``loss: nan`` to the end otherwise).
"""
import hashlib
import os
import pickle

import torch
from mmengine.dist import is_main_process, master_only
from mmengine.fileio import LocalBackend, register_backend
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import AmpOptimWrapper
from mmengine.runner.checkpoint import _load_checkpoint, save_checkpoint
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
      empty pointer, on which ``--resume`` fails with " can not be found");
    - the best checkpoint (``save_best``): mmengine removes the previous best file before it
      writes the new one, so a write that fails leaves none; here the new one is written first,
      then the periodic checkpoint that records it, and only then is the previous one removed; a
      write that fails stops the run with its error, the new best files removed and the best
      score and file put back in the hook and the message hub, which name the previous best,
      complete (``_save_best_checkpoint``);
    - the published model (``published_keys``) is written as the checkpoints are (mmengine
      writes it in place).

    Non-finite weights are not saved: the run stops instead (``faults.refuse_non_finite_weights``),
    so a checkpoint is never replaced by a diverged one.

    ``_save_checkpoint_with_step``, ``_save_best_checkpoint`` and ``_publish_model`` are mmengine
    0.10's with these changes (the first writes the pointer with ``open`` itself, which no argument
    reaches, so it is not called)."""

    def __init__(self, *args, out_dir=None, file_client_args=None, backend_args=None, **kwargs):
        if backend_args is None and file_client_args is None and "://" not in str(out_dir or ""):
            backend_args = dict(backend=ATOMIC_LOCAL_BACKEND)
        super().__init__(*args, out_dir=out_dir, file_client_args=file_client_args, backend_args=backend_args,
                         **kwargs)

    def _save_checkpoint_with_step(self, runner, step, meta):
        self._point_to_last_checkpoint(runner, self._write_checkpoint(runner, step, meta))

    def _write_checkpoint(self, runner, step, meta):
        """The periodic checkpoint of ``step``, written whole after mmengine's bookkeeping (which
        it saves); the paths of the checkpoints it outdates (``_keep``)."""
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
        return outdated

    def _point_to_last_checkpoint(self, runner, outdated) -> None:
        """``last_checkpoint`` made to name the checkpoint just written, then the ``outdated`` ones
        removed."""
        if not is_main_process():  # model-parallel saving gathers on every rank; one writes the files
            return
        atomic_write_text(os.path.join(runner.work_dir, "last_checkpoint"), self.last_ckpt)
        for path in outdated:
            self._remove(path)

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

    def _remove(self, path) -> bool:
        """Remove the checkpoint ``path``, if it is there (True then)."""
        if self.file_backend.isfile(path):
            self.file_backend.remove(path)
        elif self.file_backend.isdir(path):  # DeepSpeed saves a checkpoint as a folder
            self.file_backend.rmtree(path)
        else:
            return False
        return True

    def _save_best_checkpoint(self, runner, metrics) -> None:
        """mmengine 0.10's, reordered: the new best checkpoints written first, then the periodic
        one that records them (mmengine writes it last too), then the previous best ones removed.

        A write that fails (a full disk) raises its error, which stops the run; every checkpoint
        file then on disk is complete and names complete best files, as ``last_checkpoint`` names
        a complete checkpoint. Where a new best file or the periodic checkpoint that records it
        fails, the new best files this call wrote are removed, and the hook's and the message hub's
        best scores and paths are as before the call (``_set_best``), naming the previous best
        files, still there (one saved again at its own step, under its own name, was replaced
        whole). What the failed periodic save had already recorded, the hook's ``last_ckpt`` and
        the message hub's ``last_ckpt`` and ``keep_ckpt_ids`` (mmengine's bookkeeping, before the
        write), is not put back: the run stops, so no checkpoint saves it. Where that checkpoint is
        complete and only ``last_checkpoint`` fails, the new best files stay (it, the hook and the
        message hub name them), and so do the previous ones (not yet removed)."""
        if not self.save_best:
            return
        step, unit = (runner.epoch, "epoch") if self.by_epoch else (runner.iter, "iter")
        ckpt_filename = self.filename_tmpl.format(step)
        meta = dict(epoch=runner.epoch, iter=runner.iter)
        if "auto" in self.key_indicators:
            self._init_rule(self.rules, [list(metrics.keys())[0]])
        previous = {}  # of each improved key indicator: its best (score, path) before
        for key_indicator, rule in zip(self.key_indicators, self.rules):
            score, score_key = metrics[key_indicator], self._best_info_keys(key_indicator)[0]
            if score is not None and self.is_better_than[key_indicator](
                    score, runner.message_hub.get_info(score_key, self.init_value_map[rule])):
                previous[key_indicator] = (runner.message_hub.get_info(score_key), self._best_path(key_indicator))
        if not previous:
            return
        written, outdated = [], None  # the new best files, complete; the checkpoints the periodic one outdates
        try:
            for key_indicator in previous:
                score = metrics[key_indicator]
                name = f"best_{key_indicator}_{ckpt_filename}".replace("/", "_")
                path = self.file_backend.join_path(self.out_dir, name)
                # named before it is saved, as mmengine: the file's own message hub names it
                self._set_best(runner, key_indicator, score, path)
                runner.save_checkpoint(self.out_dir, filename=name, file_client_args=self.file_client_args,
                                       save_optimizer=False, save_param_scheduler=False, meta=meta, by_epoch=False,
                                       backend_args=self.backend_args)
                written.append(path)
                runner.logger.info(f"The best checkpoint with {score:0.4f} {key_indicator} at {step} {unit} is "
                                   f"saved to {name}.")
            if self.last_ckpt is not None:  # saved again to record the new best in its message hub
                outdated = self._write_checkpoint(runner, step, meta)
        except BaseException:
            for key_indicator, (score, path) in previous.items():
                self._set_best(runner, key_indicator, score, path)
            kept = {path for _, path in previous.values()}  # a best saved again at its own step replaced itself
            if is_main_process():
                for path in [path for path in written if path not in kept]:
                    self._remove(path)
            raise
        if outdated is not None:  # the new best recorded in a complete checkpoint: kept whatever follows
            self._point_to_last_checkpoint(runner, outdated)
        for key_indicator, (_, path) in previous.items():
            if path and path != self._best_path(key_indicator) and is_main_process() and self._remove(path):
                runner.logger.info(f"The previous best checkpoint {path} is removed")

    def _best_info_keys(self, key_indicator):
        """The message hub's keys of ``key_indicator``'s best score and checkpoint (mmengine's)."""
        suffix = "" if len(self.key_indicators) == 1 else f"_{key_indicator}"
        return f"best_score{suffix}", f"best_ckpt{suffix}"

    def _best_path(self, key_indicator):
        return self.best_ckpt_path if len(self.key_indicators) == 1 else self.best_ckpt_path_dict[key_indicator]

    def _set_best(self, runner, key_indicator, score, path) -> None:
        """Record ``path`` as ``key_indicator``'s best checkpoint, of ``score``, in the hook and the
        message hub (which checkpoints save and ``--resume`` restores); None: no best yet."""
        if len(self.key_indicators) == 1:
            self.best_ckpt_path = path
        else:
            self.best_ckpt_path_dict[key_indicator] = path
        for key, value in zip(self._best_info_keys(key_indicator), (score, path)):
            if value is None:
                runner.message_hub.pop_info(key)
            else:
                runner.message_hub.update_info(key, value)

    @master_only
    def _publish_model(self, runner, ckpt_path: str) -> None:
        """mmengine 0.10's, the published file written through ``backend_args`` as the checkpoints
        are (``AtomicLocalBackend``: whole or not at all) where mmengine's writes it in place. A
        ``save_best`` key that never improved has no best file (None), which mmengine's
        ``after_train`` passes on too: nothing to publish, where mmengine's fails at the end of the run."""
        if ckpt_path is None:
            return
        checkpoint = _load_checkpoint(ckpt_path)
        removed_keys = [key for key in list(checkpoint) if key not in self.published_keys]
        for key in removed_keys:
            checkpoint.pop(key)
        if removed_keys:
            print_log(f"Key {removed_keys} will be removed because they are not found in published_keys. If you "
                      f"want to keep them, please set `{removed_keys}` in published_keys", logger="current")
        sha = hashlib.sha256(pickle.dumps(checkpoint)).hexdigest()
        final_path = os.path.splitext(ckpt_path)[0] + f"-{sha[:8]}.pth"
        save_checkpoint(checkpoint, final_path, file_client_args=self.file_client_args, backend_args=self.backend_args)
        print_log(f"The checkpoint ({ckpt_path}) is published to {final_path}.", logger="current")


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
