#!/usr/bin/env python
"""Train / evaluate an SR-ViT Mask R-CNN with a LazyConfig, like detectron2's
``tools/lazyconfig_train_net.py``:

    python tools/train_net.py --config detectron2_configs/mask_rcnn_srvit_s_t3.py --num-gpus 8
    python tools/train_net.py --config ... --eval-only train.init_checkpoint=output/model_final.pth
    python tools/train_net.py --config ... --resume                 # continue from output_dir
    python tools/train_net.py --config ... train.max_iter=1000 dataloader.train.total_batch_size=8
    python tools/train_net.py --config ... --coco-train train.json train/ --coco-val val.json val/   # your data

Configs are found by path, or by name through the installed package
(``--config mask_rcnn_srvit_s_t3.py``). ``train.init_checkpoint`` takes a
``tools/pretrain.py`` checkpoint, a timm DeiT state dict, or a detectron2 checkpoint; a
pretraining checkpoint that lacks backbone weights is refused unless
``model.backbone.net.allow_partial=True``. The datasets' files are checked before the model is
built (tools/check_data.py's check; ``--skip-data-check`` skips it).
"""
from detectron2.engine import default_argument_parser

from srvit_backbones.detectron2 import faults, train_net
from srvit_backbones.errors import tool_main


def parse_args(argv=None):
    """detectron2's arguments (--num-gpus, --num-machines, --machine-rank, --dist-url, --resume,
    --eval-only, key=value overrides) with --config, your own data's and --skip-data-check."""
    return train_net.parse_args(default_argument_parser(epilog=__doc__), argv)


@tool_main
def main(args):
    """What each launched process runs (``train_net.main``); an SRViTError ends that process with
    its message (exit status 1, which ends the job)."""
    return train_net.main(args)


@tool_main
def run(args):
    """The data check, then ``main`` in every process of the job (``faults.launch``)."""
    train_net.check_data(args)
    faults.launch(main, args)


if __name__ == "__main__":
    run(parse_args())
