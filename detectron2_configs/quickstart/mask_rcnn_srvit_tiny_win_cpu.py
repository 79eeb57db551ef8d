"""The quickstart (mask_rcnn_srvit_tiny_cpu.py) with ViTDet's attention settings scaled to its
192-pixel images, to check that the windowed backbone learns as the global one does (same seed,
data and schedule): 4x4 windows on the 12x12 patch grid (3x3 windows, as ViTDet's 14x14 windows
tile its 64x64 grid in 5x5 with padding), relative positions on, the core's default global
applications (1, 7, 11, 13 of SR-ViT-T T=2's 14)."""
from ..common.vitdet_window import vitdet_window as _vitdet_window
from .mask_rcnn_srvit_tiny_cpu import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.update(_vitdet_window, window_size=4)
train.output_dir = "output/quickstart_detectron2_win"
