#!/usr/bin/env python
"""ImageNet pretraining of SR-ViT with the DeiT recipe (paper Table 8), reusing the core model.

    python tools/pretrain.py --data /data/imagenet --model srvit_s_t3
    torchrun --nproc_per_node 8 tools/pretrain.py --data /data/imagenet --model srvit_s_t3 --model-ema
    python tools/pretrain.py --data ... --model srvit_s_t3 --finetune-384 output/pretrain/best.pth
    python tools/pretrain.py --model srvit_s_t4 --dry-run      # print the resolved recipe

Checkpoints (OUTPUT/last.pth, OUTPUT/best.pth) load directly into Detectron2
(train.init_checkpoint) and MMSegmentation (init_cfg=dict(type='Pretrained', checkpoint=...)).
The pieces live in srvit_backbones.pretrain (recipe, trainer, engine).
"""
import json
import logging

import torch
import torch.distributed as dist

from srvit_backbones.errors import tool_main
from srvit_backbones.pretrain import recipe, trainer


@tool_main
def main(argv=None):
    args = recipe.parse(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%m/%d %H:%M:%S")
    if args.dry_run:
        print(json.dumps(vars(args), indent=2))
        return None
    if not args.data:
        raise SystemExit("--data DIR is required (an ImageFolder root with train/ and val/)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no GPU is available: pass --device cpu (and expect it to be slow)")
    distributed = trainer.init_distributed(args)
    stats = trainer.fit(trainer.build(args, distributed))
    if distributed:
        dist.destroy_process_group()
    return stats


if __name__ == "__main__":
    main()
