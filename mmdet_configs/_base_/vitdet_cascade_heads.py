# ViTDet's Cascade R-CNN heads (detectron2's projects/ViTDet/configs/COCO/cascade_mask_rcnn_vitdet_b_100ep.py)
# in mmdet's terms, as variables the cascade recipes put in place of Mask R-CNN's box head:
# - three Shared4Conv1FCBBoxHead stages (4 convs + 1 fc of 1024, LayerNorm), class-agnostic
#   regression, box-delta stds 1/(10, 10, 5, 5), 1/(20, 20, 10, 10), 1/(30, 30, 15, 15)
#   (detectron2's Box2BoxTransform weights), L1 box loss (detectron2's smooth L1 with beta 0)
# - proposals matched at IoU 0.5 / 0.6 / 0.7, no low-quality matches; stage 1 samples 512 RoIs,
#   25% positive, ground truth added; stages 2 and 3 train on every box the previous stage refined
#   (PseudoSampler; SingleMaskCascadeRoIHead keeps the refined ground-truth boxes), as detectron2's do
# - one mask head, trained on the first stage's samples, run on the final boxes (detectron2's;
#   mmdet's CascadeRoIHead would hold one per stage)
# - the stages' losses unweighted (detectron2 sums them) and the gradient reaching the pooled
#   features scaled by 1/3 in each stage (detectron2's _ScaleGradient: SingleMaskCascadeRoIHead)
# vitdet_cascade_roi_head_lvis: the same with LVIS v1's box predictors (1203 classes, sigmoid CE with
# the federated loss: srvit_backbones.mmdet.FederatedSigmoidCELoss, LVIS v1's shipped image counts).


def _stage(weights, num_classes=80, loss_cls=None):
    return dict(
        type='Shared4Conv1FCBBoxHead',
        in_channels=256,
        conv_out_channels=256,
        fc_out_channels=1024,
        roi_feat_size=7,
        norm_cfg=dict(type='LayerNorm2d', eps=1e-6, requires_grad=True),  # detectron2's LN
        num_classes=num_classes,
        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0.0, 0.0, 0.0, 0.0],
                        target_stds=[1 / weights[0], 1 / weights[0], 1 / weights[1], 1 / weights[1]]),
        reg_class_agnostic=True,
        loss_cls=loss_cls or dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=1.0))


_box_weights = [(10, 5), (20, 10), (30, 15)]
vitdet_cascade_roi_head = dict(
    type='SingleMaskCascadeRoIHead',  # one mask head, as detectron2's (srvit_backbones.mmdet)
    num_stages=3,
    stage_loss_weights=[1.0, 1.0, 1.0],
    bbox_head=[_stage(w) for w in _box_weights])
vitdet_cascade_roi_head_lvis = dict(
    vitdet_cascade_roi_head,
    bbox_head=[_stage(w, 1203, dict(type='FederatedSigmoidCELoss', image_counts='lvis_v1', num_classes=1203,
                                    freq_weight_power=0.5, num_fed_loss_classes=50)) for w in _box_weights])
vitdet_cascade_rcnn_train_cfg = [
    dict(
        assigner=dict(type='MaxIoUAssigner', pos_iou_thr=iou, neg_iou_thr=iou, min_pos_iou=iou,
                      match_low_quality=False, ignore_iof_thr=-1),
        sampler=sampler,
        mask_size=28,
        pos_weight=-1,
        debug=False) for iou, sampler in zip((0.5, 0.6, 0.7), [
            dict(type='RandomSampler', num=512, pos_fraction=0.25, neg_pos_ub=-1, add_gt_as_proposals=True),
            dict(type='PseudoSampler'),
            dict(type='PseudoSampler')])
]
