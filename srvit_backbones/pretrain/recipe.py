"""The DeiT recipe of the paper's Table 8 (SPEC section 3) as argument defaults."""
import argparse
from typing import Optional, Sequence, Set

import torch

from srvit_backbones.errors import ConfigError
from srvit_backbones.models import variant_args
from srvit_backbones.training.amp import PRECISIONS

#: warmup epochs by recursion depth T (Table 8); T=1 (DeiT) uses DeiT's 5
WARMUP_EPOCHS_BY_T = {1: 5, 2: 5, 3: 10, 4: 20}

RECIPE_224 = dict(epochs=300, batch_size=1024, lr=1e-3, weight_decay=0.05, sched="cosine", min_lr=1e-5,
                  warmup_lr=1e-6, input_size=224, crop_pct=0.875, auto_augment="rand-m9-mstd0.5-inc1",
                  aug_repeats=3, reprob=0.25, mixup=0.8, cutmix=1.0, smoothing=0.1, drop_path=0.1)
#: lr 1e-5 is the paper's for batch 512, so it is stated for lr_base_batch 512 (not 224's 1024)
RECIPE_384 = dict(RECIPE_224, epochs=30, batch_size=512, lr=1e-5, lr_base_batch=512, min_lr=1e-6, warmup_epochs=0,
                  input_size=384, crop_pct=1.0)


def build_parser() -> argparse.ArgumentParser:
    r = RECIPE_224
    p = argparse.ArgumentParser(
        description="ImageNet pretraining of SR-ViT with the DeiT recipe (paper Table 8). "
                    "Single GPU: python tools/pretrain.py --data DIR --model srvit_s_t3; "
                    "multi-GPU: torchrun --nproc_per_node 8 tools/pretrain.py ...",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", help="ImageFolder root with train/ and val/ class folders (required to train)")
    p.add_argument("--model", default="srvit_s_t3", help="a registered SR-ViT variant")
    p.add_argument("--output", default="output/pretrain", help="checkpoints and logs go here")
    p.add_argument("--resume", default="", help="checkpoint to resume from ('auto': OUTPUT/last.pth if present)")
    p.add_argument("--finetune-384", default="", metavar="CKPT",
                   help="384-resolution fine-tuning from a 224 checkpoint (30 epochs, batch 512, lr 1e-5, crop 1.0)")
    p.add_argument("--epochs", type=int, default=r["epochs"])
    p.add_argument("--batch-size", type=int, default=r["batch_size"], help="global batch (all processes)")
    p.add_argument("--lr", type=float, default=r["lr"],
                   help="lr for --lr-base-batch images; scaled linearly to --batch-size (--dry-run shows effective_lr)")
    p.add_argument("--lr-base-batch", type=int, default=1024, help="512 with --finetune-384")
    p.add_argument("--sched", default=r["sched"], help="timm scheduler name")
    p.add_argument("--min-lr", type=float, default=r["min_lr"])
    p.add_argument("--warmup-lr", type=float, default=r["warmup_lr"])
    p.add_argument("--warmup-epochs", type=int, default=None, help="default: 5 / 10 / 20 for T = 2 / 3 / 4")
    p.add_argument("--weight-decay", type=float, default=r["weight_decay"])
    p.add_argument("--clip-grad", type=float, default=None)
    p.add_argument("--input-size", type=int, default=r["input_size"])
    p.add_argument("--crop-pct", type=float, default=r["crop_pct"], help="evaluation crop ratio")
    p.add_argument("--aa", dest="auto_augment", default=r["auto_augment"], help="RandAugment policy")
    p.add_argument("--aug-repeats", type=int, default=r["aug_repeats"], help="repeated augmentation (distributed)")
    p.add_argument("--reprob", type=float, default=r["reprob"], help="random erasing probability")
    p.add_argument("--mixup", type=float, default=r["mixup"])
    p.add_argument("--cutmix", type=float, default=r["cutmix"])
    p.add_argument("--smoothing", type=float, default=r["smoothing"])
    p.add_argument("--drop-path", type=float, default=r["drop_path"])
    p.add_argument("--model-ema", action="store_true", help="keep an EMA of the weights")
    p.add_argument("--model-ema-decay", type=float, default=0.99996)
    p.add_argument("--distill", action="store_true", help="DeiT hard distillation (adds a distillation token)")
    p.add_argument("--teacher", default="regnety_160", help="timm teacher model")
    p.add_argument("--teacher-weights", default="", help="local weights file of the teacher")
    p.add_argument("--amp", nargs="?", const="auto", default="auto", choices=PRECISIONS,
                   help="mixed precision (srvit_backbones.training.amp): auto = fp16 + GradScaler on CUDA, "
                        "bf16 on a CPU with native bf16 (an error on one without); bf16 / fp16 to choose; "
                        "none = fp32")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--log-interval", type=int, default=50, help="iterations between log lines")
    p.add_argument("--max-iters-per-epoch", type=int, default=0, help="cap (smoke tests); 0 = whole epoch")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the resolved recipe and exit")
    return p


def explicit_options(argv: Optional[Sequence[str]]) -> Set[str]:
    """The destinations ``argv`` sets, whatever their value (an explicit default counts)."""
    parser, unset = build_parser(), object()
    namespace = argparse.Namespace(**{key: unset for key in vars(parser.parse_args([]))})
    return {key for key, value in vars(parser.parse_args(argv, namespace)).items() if value is not unset}


def resolve(args: argparse.Namespace, num_steps: int, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Fill the 384 fine-tuning values ``argv`` does not set, warmup by T, and ``effective_lr`` (``lr``
    scaled linearly from ``lr_base_batch`` to ``batch_size``)."""
    if args.finetune_384:
        explicit = explicit_options(argv)
        for key, value in RECIPE_384.items():
            if key not in explicit:
                setattr(args, key, value)
    if args.warmup_epochs is None:
        args.warmup_epochs = 0 if args.finetune_384 else WARMUP_EPOCHS_BY_T.get(num_steps, 20)
    args.effective_lr = args.lr * args.batch_size / args.lr_base_batch
    return args


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line, parsed and resolved for the variant's T (``ConfigError`` for an unknown ``--model``)."""
    args = build_parser().parse_args(argv)
    try:
        num_steps = variant_args(args.model)["num_steps"]
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return resolve(args, num_steps, argv)
