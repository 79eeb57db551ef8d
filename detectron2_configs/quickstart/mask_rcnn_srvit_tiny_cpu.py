"""A small SR-ViT Mask R-CNN that trains and evaluates on the CPU in a few minutes on the
synthetic shapes of tools/make_synthetic_coco.py (DETECTRON2_DATASETS=datasets). The same
recipe as the paper configs, at a tiny scale: 192x192 LSJ, a 64-wide SR-ViT (T=2), 64-channel
pyramid and heads."""
import detectron2.data.transforms as T
from detectron2.config import LazyCall as L

from ..common.mask_rcnn_srvit import dataloader, lr_multiplier, model, optimizer, train

image_size = 192
model.backbone.net.update(variant="srvit_t_t2", img_size=image_size, embed_dim=64, num_heads=2,
                          drop_path_rate=0.0)
model.backbone.square_pad = image_size
model.backbone.out_channels = 64
model.proposal_generator.head.in_channels = 64
model.roi_heads.box_head.input_shape.channels = 64
model.roi_heads.mask_head.input_shape.channels = 64
model.roi_heads.box_head.conv_dims = [64, 64]
model.roi_heads.box_head.fc_dims = [256]
model.roi_heads.box_predictor.input_shape.channels = 256
model.roi_heads.mask_head.conv_dims = [64, 64]
model.roi_heads.batch_size_per_image = 128
model.roi_heads.box_predictor.test_score_thresh = 0.01  # a short run scores low

dataloader.train.mapper.augmentations = [
    L(T.RandomFlip)(horizontal=True),
    L(T.ResizeScale)(min_scale=0.5, max_scale=1.5, target_height=image_size, target_width=image_size),
    L(T.FixedSizeCrop)(crop_size=(image_size, image_size), pad=False),
]
dataloader.test.mapper.augmentations = [L(T.ResizeShortestEdge)(short_edge_length=image_size, max_size=image_size)]
dataloader.train.total_batch_size = 4
dataloader.train.num_workers = 1
dataloader.test.num_workers = 1

train.device = "cpu"
train.amp.enabled = False  # fp32: AMPTrainer (mixed precision) needs a CUDA GPU
train.max_iter = 300
train.eval_period = 300
train.checkpointer.period = 150
train.log_period = 20
train.output_dir = "output/quickstart_detectron2"
train.init_checkpoint = ""
train.seed = 0  # fixed, so that variants of this config (the _win one) compare same-seed
optimizer.lr = 4e-4
lr_multiplier.warmup_length = 30 / train.max_iter
