# Mask R-CNN with an SR-ViT backbone and ViTDet's Simple Feature Pyramid, the paper's COCO recipe
# (SPEC section 4) in mmdet's terms, as mmdet's projects/ViTDet writes it (which the pip wheel
# lacks; srvit_backbones.mmdet registers the backbone, pyramid, optimizer constructor and hook):
# - LSJ: 1024x1024 crops of images resized by 0.1-2.0, padded to 1024; tested padded to 1024
# - RPN with 2 convs, 4conv1fc box head and mask head with LayerNorm (ViTDet's "LN")
# - AdamW lr 1e-4, weight decay 0.1 (none on norms, biases and positions: mmdet ViTDet's
#   convention), layer-wise lr decay 0.7 by the shared-block rule (srvit_backbones/layer_decay.py,
#   the one detectron2 uses), mixed precision
# - 270k iterations at batch 2 per GPU x 8 GPUs = 16, 1000-iteration linear warmup, cosine to 0
# Variant configs change only the backbone (and the pyramid's input width) and the checkpoint.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['srvit_backbones.mmdet'], allow_failed_imports=False)

image_size = (1024, 1024)
embed_dim = 384
norm_cfg = dict(type='LayerNorm2d', eps=1e-6, requires_grad=True)  # detectron2's LN (mmcv would make eps 1e-5)
model = dict(
    data_preprocessor=dict(
        # Every image (at most 1024 a side after the test Resize) is padded to the 1024 square after
        # normalisation, with 0 (the mean pixel), as detectron2's square_pad and ViTDet test. The
        # pad is not part of img_shape, so detections are clipped to the image, not the padding.
        pad_size_divisor=image_size[0],
        batch_augments=[dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]),
    backbone=dict(
        _delete_=True,
        type='SRViT',
        variant='srvit_s_t3',
        img_size=image_size,  # a full 64x64 position table, resized from the 14x14 one on loading
        out_indices=None,  # the last block's output: the pyramid's one input
        drop_path_rate=0.1,
        with_cp=False,
        prefer_ema=False,  # True: a pretraining checkpoint's EMA weights
        allow_partial=False,  # variant configs add init_cfg=dict(type='Pretrained', checkpoint=...)
        # torch.compile the backbone: True (inductor) or torch.compile's arguments, e.g.
        # dict(mode='max-autotune'); the heads stay eager (their shapes depend on the data)
        compile=False),
    neck=dict(
        _delete_=True,
        type='SimpleFeaturePyramid',
        in_channels=embed_dim,
        out_channels=256,
        scale_factors=(4.0, 2.0, 1.0, 0.5),
        num_outs=5,
        norm_cfg=norm_cfg),
    rpn_head=dict(num_convs=2),
    roi_head=dict(
        bbox_head=dict(type='Shared4Conv1FCBBoxHead', conv_out_channels=256, norm_cfg=norm_cfg),
        mask_head=dict(norm_cfg=norm_cfg)))

backend_args = None
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=image_size, recompute_bbox=True,
         allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='PackDetInputs'),
]
# Test images: the long side resized to 1024 with Pillow's bilinear filter (detectron2's
# ResizeShortestEdge), then padded to the 1024 square by the data preprocessor (pad_size_divisor):
# the backbone sees what detectron2's does. Not mmdet's Pad: it sets img_shape to the padded size,
# so boxes would be clipped to the padding and a detection there breaks the mask paste.
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=image_size, keep_ratio=True, backend='pillow'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=2,  # x 8 GPUs = 16
    num_workers=4,
    dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(
    type='AmpOptimWrapper',
    constructor='SRViTLayerDecayOptimizerConstructor',
    # weight decay as mmdet's ViTDet constructor: none on 1-D parameters (norms), biases, nor the
    # core's no_weight_decay() names (position table, tokens, rel-pos tables)
    paramwise_cfg=dict(layer_decay_rate=0.7, weight_decay_convention='norms_and_biases'),
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1))

max_iters = 270000
interval = 10000
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='CosineAnnealingLR', T_max=max_iters - 1000, eta_min=0.0, by_epoch=False, begin=1000, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=interval)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    logger=dict(interval=50, log_metric_by_epoch=False),  # evaluations logged at their iteration (as mmseg's)
    # written whole or not at all (docs/faults.md)
    checkpoint=dict(type='SRViTCheckpointHook', by_epoch=False, interval=interval, save_last=True, max_keep_ckpts=3))
log_processor = dict(by_epoch=False)
# gradients all-reduced in fp16 under DDP (detectron2's train.ddp.fp16_compression)
# and a diverged run stopped (DivergenceCheckHook, docs/faults.md)
custom_hooks = [dict(type='Fp16CompressionHook'), dict(type='DivergenceCheckHook')]
# the collective timeout and torchrun on machines without a GPU, also in mmdet's own tools/train.py
runner_type = 'SRViTRunner'
auto_scale_lr = dict(enable=False, base_batch_size=16)
