"""LVIS v1 as ViTDet trains on it (detectron2's projects/ViTDet/configs/LVIS/): what the lvis/
configs change in a COCO config.

- data: ``lvis_v1_train`` with repeat-factor sampling at threshold 0.001 (rare categories'
  images repeated), ``lvis_v1_val`` evaluated by LVISEvaluator with 300 detections per image
  (``SRViTLVISEvaluator``: the same, run under numpy 2);
  the same LSJ augmentation at 1024 (common/coco_loader_lsj.py)
- model: 1203 classes; every box predictor with sigmoid cross-entropy and the federated loss
  (class weights: LVIS v1's image counts to the power 0.5), score threshold 0.02, top 300
- schedule: as many epochs as the COCO recipe (ViTDet's ratio: 156250 LVIS iterations for
  184375 COCO ones, LVIS v1 train holding 100k images to COCO's 118k), same warmup in iterations;
  twice the COCO lr (ViTDet's LVIS configs set 2e-4 where its COCO ones take 1e-4, the same
  batch); LVIS val evaluated every 30000 iterations (ViTDet's LVIS eval_period: an evaluation of
  LVIS val takes long), checkpoints as often as on COCO.

``lvis_box_predictor`` updates a FastRCNNOutputLayers config (Cascade R-CNN: each of the three);
``lvis_schedule(train, lr_multiplier, optimizer)`` turns a COCO schedule into LVIS's. An LVIS
config pointed at a COCO-format file is refused by tools/train_net.py before anything is built
(srvit_backbones.data.lvis.check_lvis_annotations).
"""
from detectron2.config import LazyCall as L
from detectron2.data.samplers import RepeatFactorTrainingSampler

from srvit_backbones.detectron2 import SRViTLVISEvaluator, fed_loss_cls_weights

from .coco_loader_lsj import dataloader

num_classes = 1203

dataloader.train.dataset.names = "lvis_v1_train"
dataloader.train.sampler = L(RepeatFactorTrainingSampler)(
    repeat_factors=L(RepeatFactorTrainingSampler.repeat_factors_from_category_frequency)(
        dataset_dicts="${dataloader.train.dataset}", repeat_thresh=0.001
    )
)
dataloader.test.dataset.names = "lvis_v1_val"
dataloader.evaluator = L(SRViTLVISEvaluator)(
    dataset_name="${..test.dataset.names}",
    max_dets_per_image=300,
)

lvis_box_predictor = dict(
    test_score_thresh=0.02,
    test_topk_per_image=300,
    use_sigmoid_ce=True,
    use_fed_loss=True,
    # ViTDet: lambda: get_fed_loss_cls_weights(dataloader.train.dataset.names, 0.5); here a
    # LazyCall that returns that callable, so that the config saves as yaml
    get_fed_loss_cls_weights=L(fed_loss_cls_weights)(dataset_names="${dataloader.train.dataset.names}",
                                                     freq_weight_power=0.5),
)

COCO_TO_LVIS_ITERATIONS = 156250 / 184375  # ViTDet's 100-epoch schedules: LVIS / COCO
COCO_TO_LVIS_LR = 2e-4 / 1e-4  # ViTDet's lr: LVIS / COCO
EVAL_PERIOD = 30000  # ViTDet's LVIS train.eval_period


def lvis_schedule(train, lr_multiplier, optimizer):
    """The COCO schedule ``train.max_iter`` over LVIS's epochs, warmup kept in iterations; the
    COCO lr times ViTDet's LVIS / COCO ratio; ViTDet's LVIS eval period; the checkpoint period kept."""
    coco_iters = train.max_iter
    train.max_iter = round(coco_iters * COCO_TO_LVIS_ITERATIONS)
    lr_multiplier.warmup_length *= coco_iters / train.max_iter
    optimizer.lr *= COCO_TO_LVIS_LR
    train.eval_period = EVAL_PERIOD
