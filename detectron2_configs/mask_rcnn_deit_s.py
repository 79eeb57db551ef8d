"""The DeiT-S baseline (T=1) through the same SR-ViT code."""
from .common.mask_rcnn_srvit import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.variant = "srvit_deit_s"
train.init_checkpoint = "pretrained/deit_small_patch16_224.pth"  # a timm DeiT-S state dict
