"""bViT-B (one ViT-B block applied 12 times, 8.6M backbone parameters) in the same recipe: the
Simple Feature Pyramid takes the last step's output, as ViTDet's takes its last block's."""
from .common.mask_rcnn_srvit import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.variant = "bvit_b"
train.init_checkpoint = "pretrained/bvit_b_in1k.pth"  # from tools/pretrain.py --model bvit_b
