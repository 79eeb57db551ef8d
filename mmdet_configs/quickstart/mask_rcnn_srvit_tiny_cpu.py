# A small SR-ViT Mask R-CNN that trains and evaluates on the CPU in a few minutes on the
# synthetic shapes of tools/make_synthetic_coco.py (--root datasets). The same recipe as the
# paper configs at a tiny scale: 192x192 LSJ, a 64-wide SR-ViT (T=2), a 64-channel pyramid and
# heads, fp32 (mixed precision needs a GPU); as detectron2_configs/quickstart/mask_rcnn_srvit_tiny_cpu.py.
_base_ = '../_base_/mask_rcnn_srvit_sfp_lsj_270k_coco.py'

image_size = (192, 192)
embed_dim = 64
channels = 64
data_root = 'datasets/coco/'
model = dict(
    data_preprocessor=dict(pad_size_divisor=image_size[0],
                           batch_augments=[dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]),
    backbone=dict(variant='srvit_t_t2', img_size=image_size, embed_dim=embed_dim, num_heads=2, drop_path_rate=0.0),
    neck=dict(in_channels=embed_dim, out_channels=channels),
    rpn_head=dict(in_channels=channels, feat_channels=channels),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=channels),
        bbox_head=dict(type='ConvFCBBoxHead', in_channels=channels, num_shared_convs=2, num_shared_fcs=1,
                       conv_out_channels=channels, fc_out_channels=256),
        mask_roi_extractor=dict(out_channels=channels),
        mask_head=dict(in_channels=channels, conv_out_channels=channels, num_convs=2)),
    train_cfg=dict(rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rcnn=dict(score_thr=0.01)))  # a short run scores low

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.5, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=image_size, recompute_bbox=True,
         allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True, backend='pillow'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator

optim_wrapper = dict(type='OptimWrapper', optimizer=dict(lr=4e-4))
max_iters = 300
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=30),
    dict(type='CosineAnnealingLR', T_max=max_iters - 30, eta_min=0.0, by_epoch=False, begin=30, end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(interval=150))
custom_hooks = [dict(type='DivergenceCheckHook')]  # no fp16 compression on the CPU
randomness = dict(seed=0)
work_dir = 'output/quickstart_mmdet'
