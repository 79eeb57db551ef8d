"""A pretraining run from resolved arguments: ``build`` assembles it and restores a checkpoint,
``fit`` runs the epochs (two steps, so that the restored state can be inspected)."""
import argparse
import json
import logging
import os
from dataclasses import dataclass
from typing import Optional

import timm
import torch
import torch.distributed as dist
import torch.nn as nn
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, NativeScaler

import srvit_backbones  # noqa: F401  (registers the variants)
from srvit_backbones import load_pretrained
from srvit_backbones.checkpoint import read_checkpoint
from srvit_backbones.errors import CheckpointError, ConfigError
from srvit_backbones.training import amp
from srvit_backbones.training.faults import collective_timeout

from . import engine

logger = logging.getLogger("srvit.pretrain")


@dataclass
class Run:
    args: argparse.Namespace
    distributed: bool
    model: nn.Module  # the bare model: checkpoints, evaluation, EMA source
    train_model: nn.Module  # the model, compiled and/or DDP-wrapped when asked
    optimizer: torch.optim.Optimizer
    scheduler: object
    loss_scaler: Optional[NativeScaler]
    model_ema: Optional[ModelEmaV3]
    criterion: nn.Module
    train_loader: object
    val_loader: object
    mixup_fn: object
    num_classes: int
    iters_per_epoch: int
    start_epoch: int
    best_top1: float
    state: dict  # {"global_iter": optimizer steps so far}, advanced by engine.train_one_epoch


def init_distributed(args) -> bool:
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    backend = "nccl" if args.device.startswith("cuda") else "gloo"
    dist.init_process_group(backend=backend, timeout=collective_timeout())
    if args.device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return True


def build_teacher(args, num_classes, device):
    if not args.teacher_weights:
        raise ConfigError(f"--distill needs the teacher's weights: --teacher-weights FILE (a {args.teacher} "
                          f"state dict for {num_classes} classes; nothing is downloaded)")
    teacher = timm.create_model(args.teacher, num_classes=num_classes, pretrained=True,
                                pretrained_cfg_overlay=dict(file=args.teacher_weights))
    return teacher.to(device).eval().requires_grad_(False)


def resume_path(args) -> str:
    """The checkpoint to resume from, or '' ('auto' without OUTPUT/last.pth starts afresh)."""
    if args.resume != "auto":
        return args.resume
    path = os.path.join(args.output, "last.pth")
    return path if os.path.isfile(path) else ""


def build(args, distributed: bool) -> Run:
    """Everything a run needs, ``--resume``'s state restored (the EMA made after, from the resumed weights)."""
    device = torch.device(args.device)
    dtype = engine.precision(args)  # before any work: a precision this device cannot run is an error
    torch.manual_seed(args.seed + (dist.get_rank() if distributed else 0))
    os.makedirs(args.output, exist_ok=True)

    train_set, val_set, num_classes = engine.build_datasets(args)
    model = timm.create_model(args.model, num_classes=num_classes, drop_path_rate=args.drop_path,
                              img_size=args.input_size, distilled=args.distill)
    if args.finetune_384:
        load_pretrained(model, args.finetune_384, prefer_ema=args.model_ema, log=logger)
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if args.distill:
        model.set_distilled_training(True)
    model.to(device)
    train_loader, val_loader, mixup_fn = engine.build_loaders(args, model, train_set, val_set, num_classes,
                                                              distributed)

    optimizer = create_optimizer_v2(model, "adamw", lr=args.effective_lr, weight_decay=args.weight_decay)
    iters_per_epoch = len(train_loader) if not args.max_iters_per_epoch else min(len(train_loader),
                                                                                 args.max_iters_per_epoch)
    scheduler, _ = create_scheduler_v2(optimizer, sched=args.sched, num_epochs=args.epochs, min_lr=args.min_lr,
                                       warmup_lr=args.warmup_lr, warmup_epochs=args.warmup_epochs,
                                       step_on_epochs=False, updates_per_epoch=iters_per_epoch)
    loss_scaler = NativeScaler(device=device.type) if amp.needs_grad_scaler(dtype) else None

    if args.mixup > 0 or args.cutmix > 0:
        base_criterion = SoftTargetCrossEntropy()
    elif args.smoothing:
        base_criterion = LabelSmoothingCrossEntropy(smoothing=args.smoothing)
    else:
        base_criterion = torch.nn.CrossEntropyLoss()
    criterion = engine.HardDistillationLoss(base_criterion, build_teacher(args, num_classes, device)) \
        if args.distill else base_criterion

    start_epoch, best_top1, global_iter, ckpt = 0, 0.0, 0, None
    resume = resume_path(args)
    if resume:
        ckpt = read_checkpoint(resume)
        if ckpt.get("variant") != args.model or ckpt.get("num_classes") != num_classes:
            raise CheckpointError(f"--resume {resume} is a checkpoint of {ckpt.get('variant')!r} with "
                                  f"{ckpt.get('num_classes')} classes, not of {args.model!r} with {num_classes}: "
                                  f"resume with the same --model and dataset")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        if loss_scaler is not None and "scaler" in ckpt:
            loss_scaler.load_state_dict(ckpt["scaler"])
        start_epoch, best_top1 = ckpt["epoch"] + 1, ckpt["best_top1"]
        # checkpoints written before global_iter was saved: every epoch had iters_per_epoch steps
        global_iter = ckpt.get("global_iter", start_epoch * iters_per_epoch)
        logger.info("resumed from %s at epoch %d (best top-1 %.2f)", resume, start_epoch, best_top1)

    model_ema = None
    if args.model_ema:
        model_ema = ModelEmaV3(model, decay=args.model_ema_decay)
        if ckpt is not None and "model_ema" in ckpt:
            model_ema.module.load_state_dict(ckpt["model_ema"])
        elif ckpt is not None:
            logger.info("%s holds no EMA: the EMA starts from its weights", resume)

    # DDP first, then compile (PyTorch's order: DDP's all-reduce overlaps the compiled backward)
    train_model = model
    if distributed:
        train_model = torch.nn.parallel.DistributedDataParallel(
            train_model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile:
        train_model = torch.compile(train_model)
    return Run(args=args, distributed=distributed, model=model, train_model=train_model, optimizer=optimizer,
               scheduler=scheduler, loss_scaler=loss_scaler, model_ema=model_ema, criterion=criterion,
               train_loader=train_loader, val_loader=val_loader, mixup_fn=mixup_fn, num_classes=num_classes,
               iters_per_epoch=iters_per_epoch, start_epoch=start_epoch, best_top1=best_top1,
               state={"global_iter": global_iter})


def fit(run: Run) -> dict:
    """Train from ``run.start_epoch`` to ``args.epochs``, evaluating and checkpointing every epoch;
    returns the last epoch's evaluation."""
    args = run.args
    rank = dist.get_rank() if run.distributed else 0
    logger.info("training %s (T=%d, D_eff=%d) for epochs %d..%d, lr %.2e (batch %d), warmup %d epochs",
                args.model, run.model.num_steps, run.model.effective_depth, run.start_epoch, args.epochs - 1,
                args.effective_lr, args.batch_size, args.warmup_epochs)
    stats, best_top1 = {}, run.best_top1
    for epoch in range(run.start_epoch, args.epochs):
        engine.seed_epoch(args.seed, epoch, rank)
        if run.distributed and hasattr(run.train_loader.sampler, "set_epoch"):
            run.train_loader.sampler.set_epoch(epoch)
        engine.train_one_epoch(epoch, run.train_model, run.train_loader, run.optimizer, run.criterion,
                               run.scheduler, args, loss_scaler=run.loss_scaler, mixup_fn=run.mixup_fn,
                               model_ema=run.model_ema, distill=args.distill, state=run.state)
        stats = engine.evaluate(run.model, run.val_loader, args)
        if run.model_ema is not None:
            stats["ema"] = engine.evaluate(run.model_ema.module, run.val_loader, args)
        is_best = stats["top1"] > best_top1
        best_top1 = max(best_top1, stats["top1"])
        logger.info("epoch %d: top-1 %.2f top-5 %.2f (%d images), best top-1 %.2f", epoch, stats["top1"],
                    stats["top5"], stats["images"], best_top1)
        if engine.is_main():
            names = ["last.pth"] + (["best.pth"] if is_best else [])
            for name in names:
                engine.save_checkpoint(os.path.join(args.output, name), run.model, run.optimizer, run.scheduler,
                                       run.loss_scaler, epoch, best_top1, args, run.model_ema,
                                       global_iter=run.state["global_iter"])
            with open(os.path.join(args.output, "log.jsonl"), "a") as f:
                f.write(json.dumps(dict(epoch=epoch, **stats)) + "\n")
    return stats
