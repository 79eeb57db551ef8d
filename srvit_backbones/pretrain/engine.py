"""Pieces of the ImageNet loop driven by tools/pretrain.py: data, distillation loss, one epoch of
training, evaluation and checkpoints; everything timm already does well is timm's."""
import logging
import math
import os
import random
import time
from typing import List, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from timm.data import FastCollateMixup, Mixup, create_dataset, create_loader, resolve_data_config
from timm.utils import accuracy

from srvit_backbones.errors import ConfigError, InputError
from srvit_backbones.pretrain.augment import guarded_posterize
from srvit_backbones.training import amp
from srvit_backbones.training.faults import (
    Diverged,
    SkippedStepCounter,
    atomic_torch_save,
    divergence_message,
    refuse_non_finite_weights,
)

logger = logging.getLogger("srvit.pretrain")


def is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def check_image_folder(root: str, split: str) -> str:
    """``root/split``, or an ``InputError`` when it does not exist or holds no class folder."""
    path = os.path.join(root, split)
    if not os.path.isdir(path):
        raise InputError(f"dataset folder {path!r} does not exist: --data must contain train/ and val/ "
                         f"(ImageFolder layout: one sub-folder of images per class)")
    classes = [d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))]
    if not classes:
        raise InputError(f"{path!r} has no class folders: expected {path}/<class>/<image>.jpg")
    return path


def build_datasets(args):
    """timm's ImageFolder datasets and their class count (``InputError`` when train/ and val/ differ)."""
    train_set = create_dataset("", root=check_image_folder(args.data, "train"), is_training=True)
    val_set = create_dataset("", root=check_image_folder(args.data, "val"), is_training=False)
    train_classes, val_classes = train_set.reader.class_to_idx, val_set.reader.class_to_idx
    if val_classes != train_classes:
        missing, extra = sorted(set(train_classes) - set(val_classes)), sorted(set(val_classes) - set(train_classes))
        raise InputError(f"the classes of {args.data}/val differ from those of {args.data}/train (missing in val: "
                         f"{missing[:10]}, only in val: {extra[:10]}): labels are the index of a class folder, so "
                         f"val/ needs the same class folders as train/, each with images")
    return train_set, val_set, len(train_classes)


def build_loaders(args, model, train_set, val_set, num_classes: int, distributed: bool):
    """Train/val loaders with timm's transforms, sampler and, on the GPU, its prefetcher. Workers are not
    persistent: seeded per epoch by ``seed_epoch``, a resumed run repeats their augmentation."""
    data_cfg = resolve_data_config(dict(input_size=(3, args.input_size, args.input_size),
                                        crop_pct=args.crop_pct, interpolation="bicubic"), model=model)
    world = dist.get_world_size() if distributed else 1
    if args.batch_size % world:
        raise ConfigError(f"--batch-size {args.batch_size} is not divisible by the {world} processes")
    use_prefetcher = args.device.startswith("cuda")
    aug_repeats = args.aug_repeats if distributed else 0
    if args.aug_repeats and not distributed:
        logger.warning("repeated augmentation (--aug-repeats %d) needs a distributed run (timm's RepeatAugSampler); "
                       "this single-process run uses 0. Launch with torchrun to enable it.", args.aug_repeats)
    collate_fn, mixup_fn = None, None
    if args.mixup > 0 or args.cutmix > 0:
        margs = dict(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, label_smoothing=args.smoothing,
                     num_classes=num_classes)
        if use_prefetcher:
            collate_fn = FastCollateMixup(**margs)
        else:
            mixup_fn = Mixup(**margs)
    device = torch.device(args.device)
    common = dict(input_size=data_cfg["input_size"], mean=data_cfg["mean"], std=data_cfg["std"],
                  interpolation="bicubic", num_workers=args.workers, distributed=distributed,
                  use_prefetcher=use_prefetcher, device=device, persistent_workers=False,
                  pin_memory=use_prefetcher)
    with guarded_posterize():  # timm's posterize fails on the 0 bits its RandAugment asks for
        train_loader = create_loader(train_set, batch_size=args.batch_size // world, is_training=True,
                                     auto_augment=args.auto_augment, re_prob=args.reprob, re_mode="pixel",
                                     num_aug_repeats=aug_repeats, collate_fn=collate_fn, **common)
    val_loader = create_loader(val_set, batch_size=max(1, args.batch_size // world), is_training=False,
                               crop_pct=data_cfg["crop_pct"], **common)
    return train_loader, val_loader, mixup_fn


class HardDistillationLoss(nn.Module):
    """DeiT hard distillation: half the base loss on the class token's logits, half the
    cross-entropy of the distillation token's logits against the teacher's argmax."""

    def __init__(self, base_criterion: nn.Module, teacher: nn.Module):
        super().__init__()
        self.base_criterion = base_criterion
        self.teacher = teacher

    def forward(self, inputs, outputs, targets):
        logits, logits_dist = outputs
        with torch.no_grad():
            teacher_labels = self.teacher(inputs).argmax(dim=1)
        return 0.5 * self.base_criterion(logits, targets) + 0.5 * F.cross_entropy(logits_dist, teacher_labels)


def seed_epoch(seed: int, epoch: int, rank: int = 0) -> None:
    """Reseed torch, numpy and ``random`` from (seed, epoch, rank) at the start of an epoch, so that a
    resumed run repeats the epochs of an uninterrupted one."""
    s = int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])
    torch.manual_seed(s)
    np.random.seed(s)
    random.seed(s)


def precision(args) -> Optional[torch.dtype]:
    """The autocast dtype of ``--amp`` on ``--device`` (``srvit_backbones.training.amp``), or a ``ConfigError``."""
    try:
        return amp.resolve_precision(args.device, args.amp)
    except ValueError as e:
        raise ConfigError(str(e)) from None


#: steps between two reads of the loss on the host (each read is a device sync; docs/faults.md)
LOSS_CHECK_INTERVAL = 4


def train_one_epoch(epoch, model, loader, optimizer, criterion, scheduler, args, loss_scaler=None,
                    mixup_fn=None, model_ema=None, distill=False, state=None):
    """One epoch of ``loader``; returns the last step's loss.

    Raises:
        faults.Diverged: a non-finite loss (read every ``LOSS_CHECK_INTERVAL`` steps and at each log line),
            or too many fp16 steps skipped in a row.
    """
    model.train()
    device = torch.device(args.device)
    n_iters = len(loader) if not args.max_iters_per_epoch else min(len(loader), args.max_iters_per_epoch)
    total_iters = n_iters * args.epochs
    start = time.time()
    seen, unread, last_loss = 0, [], None
    dtype = precision(args)
    if loss_scaler is not None and "skipped_steps" not in state:  # the scale before the first step
        state["skipped_steps"] = SkippedStepCounter().start(loss_scaler._scaler)
    for i, (images, targets) in enumerate(loader):
        if i >= n_iters:
            break
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        if mixup_fn is not None:
            images, targets = mixup_fn(images, targets)
        with amp.autocast(args.device, dtype is not None, dtype):
            outputs = model(images)
            loss = criterion(images, outputs, targets) if distill else criterion(outputs, targets)
        optimizer.zero_grad(set_to_none=True)
        if loss_scaler is not None:
            loss_scaler(loss, optimizer, clip_grad=args.clip_grad, parameters=model.parameters())
            # GradScaler.step already reads its inf check on the host every step: reading the scale adds no sync
            if state["skipped_steps"].update(loss_scaler._scaler):
                raise Diverged(diverged(state["skipped_steps"].describe(), state["global_iter"] + 1, args))
        else:
            loss.backward()
            if args.clip_grad:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            optimizer.step()
        if model_ema is not None:
            model_ema.update(model)
        state["global_iter"] += 1
        scheduler.step_update(num_updates=state["global_iter"])
        seen += images.shape[0]
        unread.append((state["global_iter"], i, loss.detach()))
        log_now = (i + 1) % args.log_interval == 0 or i + 1 == n_iters
        if not log_now and len(unread) < LOSS_CHECK_INTERVAL:
            continue
        last_loss = read_finite_losses(unread, epoch, args)[-1]
        unread = []
        if log_now and is_main():
            elapsed = time.time() - start
            world = dist.get_world_size() if dist.is_initialized() else 1
            remaining = (total_iters - state["global_iter"]) * elapsed / (i + 1)
            logger.info("epoch %d [%d/%d] loss %.4f lr %.3e %.1f img/s eta %s", epoch, i + 1, n_iters, last_loss,
                        optimizer.param_groups[0]["lr"], seen * world / elapsed,
                        time.strftime("%H:%M:%S", time.gmtime(remaining)))
    return last_loss


def read_finite_losses(unread, epoch: int, args) -> List[float]:
    """The losses of ``unread`` ((global iteration, epoch iteration, loss) per step) in one device
    sync; ``Diverged`` at the first that is not finite."""
    values = torch.stack([loss.float() for _, _, loss in unread]).tolist()
    for (iteration, index, _), value in zip(unread, values):
        if not math.isfinite(value):
            raise Diverged(diverged(f"the loss became {value} (step {index + 1} of epoch {epoch})", iteration, args))
    return values


def diverged(what: str, iteration: int, args) -> str:
    """The message that stops a diverged run: what happened, the last checkpoint and what to try."""
    last = os.path.join(args.output, "last.pth")
    return divergence_message(what, iteration, last if os.path.isfile(last) else None, "--resume auto",
                              DIVERGENCE_FIXES)


DIVERGENCE_FIXES = ("a lower --lr (or more --warmup-epochs)", "gradient clipping: --clip-grad 1.0",
                    "--amp bf16, or fp32: --amp none")


@torch.no_grad()
def evaluate(model, loader, args, max_iters: Optional[int] = None):
    model.eval()
    device = torch.device(args.device)
    correct1 = correct5 = total = 0.0
    dtype = precision(args)
    for i, (images, targets) in enumerate(loader):
        if max_iters and i >= max_iters:
            break
        images, targets = images.to(device), targets.to(device)
        with amp.autocast(args.device, dtype is not None, dtype):
            output = model(images)
        k = min(5, output.shape[1])
        acc1, acc5 = accuracy(output.float(), targets, topk=(1, k))
        correct1 += acc1.item() * images.shape[0]
        correct5 += acc5.item() * images.shape[0]
        total += images.shape[0]
    stats = torch.tensor([correct1, correct5, total], device=device)
    if dist.is_initialized():
        dist.all_reduce(stats)
    c1, c5, n = stats.tolist()
    return {"top1": c1 / max(n, 1), "top5": c5 / max(n, 1), "images": int(n)}


def save_checkpoint(path, model, optimizer, scheduler, loss_scaler, epoch, best_top1, args, model_ema=None,
                    global_iter=0):
    """A checkpoint that loads under ``weights_only=True``; non-finite weights stop the run instead."""
    refuse_non_finite_weights(unwrap(model).state_dict(), global_iter,
                              path if os.path.isfile(path) else None, "--resume auto", DIVERGENCE_FIXES)
    ckpt = {
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": epoch,
        "global_iter": global_iter,
        "best_top1": best_top1,
        "variant": args.model,
        "num_classes": unwrap(model).num_classes,
        "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))},
    }
    if loss_scaler is not None:
        ckpt["scaler"] = loss_scaler.state_dict()
    if model_ema is not None:
        ckpt["model_ema"] = unwrap(model_ema.module).state_dict()
    atomic_torch_save(ckpt, path)  # a write killed or cut short by a full disk leaves the previous file


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside torch.compile and DDP wrappers, in either order."""
    ddp = torch.nn.parallel.DistributedDataParallel
    while isinstance(model, ddp) or "_orig_mod" in model._modules:
        model = model.module if isinstance(model, ddp) else model._orig_mod
    return model
