# Mask R-CNN on LVIS v1, as ViTDet trains on it (detectron2's projects/ViTDet/configs/LVIS/): the COCO
# recipe (mask_rcnn_srvit_sfp_lsj_270k_coco.py: model, LSJ at 1024, optimizer, layer decay) with
# - data: LVISV1Dataset (mmdet's lvis_v1_instance.py layout) in ClassBalancedDataset at 1e-3
#   (detectron2's RepeatFactorTrainingSampler at 0.001), SRViTLVISMetric (mmdet's LVISMetric, run
#   under numpy 2; 300 detections per image)
# - 1203 classes; the box head's sigmoid CE with the federated loss, weights LVIS v1's image counts
#   to the power 0.5 (srvit_backbones.mmdet.FederatedSigmoidCELoss; image_counts='lvis_v1': the
#   counts shipped in the package, as detectron2's metadata holds them, whatever file the dataset
#   reads; another dataset: image_counts=its training file); score threshold 0.02, top 300
# - as many epochs as the COCO recipe (ViTDet's ratio, 156250 LVIS iterations for 184375 COCO
#   ones): 228814 iterations, the same 1000-iteration warmup, cosine to 0
# - twice the COCO lr (ViTDet's LVIS configs: 2e-4 where its COCO ones take 1e-4, the same batch)
# - LVIS val evaluated every 30000 iterations (ViTDet's LVIS eval_period); checkpoints as COCO's.
_base_ = './mask_rcnn_srvit_sfp_lsj_270k_coco.py'

num_classes = 1203
data_root = 'data/lvis_v1/'
model = dict(
    roi_head=dict(
        bbox_head=dict(
            num_classes=num_classes,
            loss_cls=dict(_delete_=True, type='FederatedSigmoidCELoss', image_counts='lvis_v1',
                          num_classes=num_classes, freq_weight_power=0.5, num_fed_loss_classes=50)),
        mask_head=dict(num_classes=num_classes)),
    test_cfg=dict(rcnn=dict(score_thr=0.02, max_per_img=300)))

train_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='ClassBalancedDataset',
        oversample_thr=1e-3,
        dataset=dict(
            type='LVISV1Dataset',
            data_root=data_root,
            ann_file='annotations/lvis_v1_train.json',
            data_prefix=dict(img=''),
            filter_cfg=dict(filter_empty_gt=True, min_size=32),
            pipeline={{_base_.train_pipeline}},
            backend_args={{_base_.backend_args}})))
val_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='LVISV1Dataset',
        data_root=data_root,
        ann_file='annotations/lvis_v1_val.json',
        data_prefix=dict(img=''),
        test_mode=True,
        pipeline={{_base_.test_pipeline}},
        backend_args={{_base_.backend_args}}))
test_dataloader = val_dataloader
val_evaluator = dict(_delete_=True, type='SRViTLVISMetric', ann_file=data_root + 'annotations/lvis_v1_val.json',
                     metric=['bbox', 'segm'], backend_args={{_base_.backend_args}})
test_evaluator = val_evaluator

max_iters = 228814  # round(270000 * 156250 / 184375)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='CosineAnnealingLR', T_max=max_iters - 1000, eta_min=0.0, by_epoch=False, begin=1000, end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=30000)
optim_wrapper = dict(optimizer=dict(lr=2e-4))
