# A small SR-ViT UPerNet that trains and evaluates on the CPU in a few minutes on the
# synthetic data of tools/make_synthetic_ade20k.py (--root datasets). Same model code and
# recipe shape as the paper configs, at a tiny scale: 128x128 crops, a 64-wide SR-ViT (T=2).
_base_ = '../_base_/upernet_srvit_mln_160k_ade20k.py'

crop_size = (128, 128)
embed_dim = 64
norm_cfg = dict(type='BN', requires_grad=True)
data_root = 'datasets/ade/ADEChallengeData2016'

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(variant='srvit_t_t2', out_indices=(1, 2, 3, 4), img_size=crop_size, embed_dim=embed_dim, num_heads=2,
                  drop_path_rate=0.0),
    neck=dict(in_channels=[embed_dim] * 4, out_channels=embed_dim),
    decode_head=dict(in_channels=[embed_dim] * 4, channels=32, pool_scales=(1, 2), norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=embed_dim, channels=32, norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(256, 128), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale_factor=r, keep_ratio=True) for r in [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]],
        [dict(type='RandomFlip', prob=0., direction='horizontal'),
         dict(type='RandomFlip', prob=1., direction='horizontal')],
        [dict(type='LoadAnnotations')],
        [dict(type='PackSegInputs')],
    ]),
]
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=20),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=20, end=200, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=200, val_interval=200)
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=100))
randomness = dict(seed=0)  # the same run every time, as the detectron2 and mmdet quickstarts
work_dir = 'output/quickstart_mmseg'
