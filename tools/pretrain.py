#!/usr/bin/env python
"""ImageNet pretraining of SR-ViT with the DeiT recipe (paper Table 8), reusing the core model.

    python tools/pretrain.py --data /data/imagenet --model srvit_s_t3
    torchrun --nproc_per_node 8 tools/pretrain.py --data /data/imagenet --model srvit_s_t3 --model-ema
    python tools/pretrain.py --data ... --model srvit_s_t3 --finetune-384 output/pretrain/best.pth
    python tools/pretrain.py --model srvit_s_t4 --dry-run      # print the resolved recipe

Checkpoints (OUTPUT/last.pth, OUTPUT/best.pth) load directly into Detectron2
(train.init_checkpoint) and MMSegmentation (init_cfg=dict(type='Pretrained', checkpoint=...)).
"""
import json
import logging
import os

import timm
import torch
import torch.distributed as dist
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, NativeScaler

import srvit_backbones  # noqa: F401  (registers the variants)
from srvit_backbones import load_pretrained
from srvit_backbones.checkpoint import read_checkpoint
from srvit_backbones.models import variant_args
from srvit_backbones.pretrain import engine, recipe

logger = logging.getLogger("srvit.pretrain")


def init_distributed(args):
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    backend = "nccl" if args.device.startswith("cuda") else "gloo"
    dist.init_process_group(backend=backend)
    if args.device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return True


def build_teacher(args, num_classes, device):
    if not args.teacher_weights:
        raise SystemExit(f"--distill needs the teacher's weights: --teacher-weights FILE (a {args.teacher} "
                         f"state dict for {num_classes} classes; nothing is downloaded)")
    teacher = timm.create_model(args.teacher, num_classes=num_classes, pretrained=True,
                                pretrained_cfg_overlay=dict(file=args.teacher_weights))
    return teacher.to(device).eval().requires_grad_(False)


def main(argv=None):
    parser = recipe.build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%m/%d %H:%M:%S")
    try:
        num_steps = variant_args(args.model)["num_steps"]
    except ValueError as e:
        raise SystemExit(str(e))
    recipe.resolve(args, num_steps, parser)
    if args.dry_run:
        print(json.dumps(vars(args), indent=2))
        return None
    if not args.data:
        raise SystemExit("--data DIR is required (an ImageFolder root with train/ and val/)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no GPU is available: pass --device cpu (and expect it to be slow)")
    distributed = init_distributed(args)
    device = torch.device(args.device)
    torch.manual_seed(args.seed + (dist.get_rank() if distributed else 0))
    os.makedirs(args.output, exist_ok=True)

    num_classes = len([d for d in os.listdir(engine.check_image_folder(args.data, "train"))
                       if os.path.isdir(os.path.join(args.data, "train", d))])
    model = timm.create_model(args.model, num_classes=num_classes, drop_path_rate=args.drop_path,
                              img_size=args.input_size, distilled=args.distill)
    if args.finetune_384:
        load_pretrained(model, args.finetune_384, prefer_ema=args.model_ema, log=logger)
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if args.distill:
        model.set_distilled_training(True)
    model.to(device)
    train_loader, val_loader, mixup_fn, _ = engine.build_loaders(args, model, distributed)

    lr = args.lr * args.batch_size / args.lr_base_batch
    optimizer = create_optimizer_v2(model, "adamw", lr=lr, weight_decay=args.weight_decay)
    iters_per_epoch = len(train_loader) if not args.max_iters_per_epoch else min(len(train_loader),
                                                                                 args.max_iters_per_epoch)
    scheduler, _ = create_scheduler_v2(optimizer, sched=args.sched, num_epochs=args.epochs, min_lr=args.min_lr,
                                       warmup_lr=args.warmup_lr, warmup_epochs=args.warmup_epochs,
                                       step_on_epochs=False, updates_per_epoch=iters_per_epoch)
    loss_scaler = NativeScaler() if args.amp == "fp16" and device.type == "cuda" else None
    model_ema = ModelEmaV3(model, decay=args.model_ema_decay) if args.model_ema else None

    if mixup_fn is not None or (args.mixup > 0 or args.cutmix > 0):
        base_criterion = SoftTargetCrossEntropy()
    elif args.smoothing:
        base_criterion = LabelSmoothingCrossEntropy(smoothing=args.smoothing)
    else:
        base_criterion = torch.nn.CrossEntropyLoss()
    criterion = engine.HardDistillationLoss(base_criterion, build_teacher(args, num_classes, device)) \
        if args.distill else base_criterion

    start_epoch, best_top1 = 0, 0.0
    resume = os.path.join(args.output, "last.pth") if args.resume == "auto" else args.resume
    if resume and (args.resume != "auto" or os.path.isfile(resume)):
        ckpt = read_checkpoint(resume)
        if ckpt.get("variant") != args.model or ckpt.get("num_classes") != num_classes:
            raise SystemExit(f"--resume {resume} is a checkpoint of {ckpt.get('variant')!r} with "
                             f"{ckpt.get('num_classes')} classes, not of {args.model!r} with {num_classes}: "
                             f"resume with the same --model and dataset")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        if loss_scaler is not None and "scaler" in ckpt:
            loss_scaler.load_state_dict(ckpt["scaler"])
        if model_ema is not None and "model_ema" in ckpt:
            model_ema.module.load_state_dict(ckpt["model_ema"])
        start_epoch, best_top1 = ckpt["epoch"] + 1, ckpt["best_top1"]
        logger.info("resumed from %s at epoch %d (best top-1 %.2f)", resume, start_epoch, best_top1)

    train_model = model
    if args.compile:
        train_model = torch.compile(model)
    if distributed:
        train_model = torch.nn.parallel.DistributedDataParallel(
            train_model, device_ids=[device.index] if device.type == "cuda" else None)

    state = {"global_iter": start_epoch * iters_per_epoch}
    logger.info("training %s (T=%d, D_eff=%d) for epochs %d..%d, lr %.2e (batch %d), warmup %d epochs",
                args.model, num_steps, model.effective_depth, start_epoch, args.epochs - 1, lr, args.batch_size,
                args.warmup_epochs)
    stats = {}
    for epoch in range(start_epoch, args.epochs):
        if distributed and hasattr(train_loader.sampler, "set_epoch"):
            train_loader.sampler.set_epoch(epoch)
        engine.train_one_epoch(epoch, train_model, train_loader, optimizer, criterion, scheduler, args,
                               loss_scaler=loss_scaler, mixup_fn=mixup_fn, model_ema=model_ema,
                               distill=args.distill, state=state)
        stats = engine.evaluate(model, val_loader, args)
        if model_ema is not None:
            stats["ema"] = engine.evaluate(model_ema.module, val_loader, args)
        is_best = stats["top1"] > best_top1
        best_top1 = max(best_top1, stats["top1"])
        logger.info("epoch %d: top-1 %.2f top-5 %.2f (%d images), best top-1 %.2f", epoch, stats["top1"],
                    stats["top5"], stats["images"], best_top1)
        if engine.is_main():
            path = os.path.join(args.output, "last.pth")
            engine.save_checkpoint(path, model, optimizer, scheduler, loss_scaler, epoch, best_top1, args, model_ema)
            if is_best:
                engine.save_checkpoint(os.path.join(args.output, "best.pth"), model, optimizer, scheduler,
                                       loss_scaler, epoch, best_top1, args, model_ema)
            with open(os.path.join(args.output, "log.jsonl"), "a") as f:
                f.write(json.dumps(dict(epoch=epoch, **stats)) + "\n")
    if distributed:
        dist.destroy_process_group()
    return stats


if __name__ == "__main__":
    main()
