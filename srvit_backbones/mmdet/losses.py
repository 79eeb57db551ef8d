"""detectron2's LVIS classification loss for mmdet's box heads, which the pip wheel lacks: sigmoid
cross-entropy with the federated loss (Zhou et al., 2021), as FastRCNNOutputLayers computes it with
``use_sigmoid_ce=True, use_fed_loss=True`` (ViTDet's LVIS configs).

Per batch of N RoIs over K classes (K + 1 logits, the last one background, unused): binary
cross-entropy on the first K logits, counted only on the classes of the batch's ground truth and
on classes drawn without replacement, with probability proportional to their weights, until 50
classes are there; summed and divided by N. The weights are each class's training image count
to the power 0.5: detectron2 reads them from LVIS v1's metadata, this loss from the LVIS training
file's ``image_count`` (the same figures for lvis_v1_train.json); a class without images counts as
one image, so that it can be drawn (LVIS v1 train has none such; synthetic files do).
"""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmdet.registry import MODELS


def fed_loss_classes(gt_classes, num_fed_loss_classes, num_classes, weight):
    """detectron2's FastRCNNOutputLayers.get_fed_loss_classes."""
    unique_gt_classes = torch.unique(gt_classes)
    prob = unique_gt_classes.new_ones(num_classes + 1).float()
    prob[-1] = 0
    if len(unique_gt_classes) < num_fed_loss_classes:
        prob[:num_classes] = weight.float().clone()
        prob[unique_gt_classes] = 0
        sampled = torch.multinomial(prob, num_fed_loss_classes - len(unique_gt_classes), replacement=False)
        unique_gt_classes = torch.cat([unique_gt_classes, sampled])
    return unique_gt_classes


def image_count_weights(ann_file, num_classes, freq_weight_power):
    with open(ann_file) as f:
        categories = sorted(json.load(f)["categories"], key=lambda c: c["id"])
    if len(categories) != num_classes or any("image_count" not in c for c in categories):
        raise ValueError(f"FederatedSigmoidCELoss: {ann_file!r} must list {num_classes} categories with "
                         f"'image_count' (an LVIS v1 training file); it lists {len(categories)}"
                         + ("" if all("image_count" in c for c in categories) else ", some without image_count"))
    counts = torch.tensor([max(int(c["image_count"]), 1) for c in categories], dtype=torch.float)
    return counts ** freq_weight_power


@MODELS.register_module()
class FederatedSigmoidCELoss(nn.Module):
    """Sigmoid CE + federated loss for a box head's ``loss_cls``; its K + 1 logits and sigmoid
    scores (background column 0) through mmdet's custom-activation hooks.

    Args:
        ann_file: the LVIS training annotation file (``image_count`` per category).
        num_classes: K (1203 for LVIS v1).
        freq_weight_power: the weights' power (detectron2's ``get_fed_loss_cls_weights(.., 0.5)``).
        num_fed_loss_classes: classes counted per batch (detectron2's ``fed_loss_num_classes``, 50).
    """

    custom_cls_channels = True
    custom_activation = True
    custom_accuracy = True
    use_sigmoid = True

    def __init__(self, ann_file, num_classes=1203, freq_weight_power=0.5, num_fed_loss_classes=50, loss_weight=1.0):
        super().__init__()
        self.num_classes, self.num_fed_loss_classes, self.loss_weight = num_classes, num_fed_loss_classes, loss_weight
        self.ann_file, self.freq_weight_power = ann_file, freq_weight_power
        self._weights = None

    @property
    def fed_loss_cls_weights(self):
        """The class weights, read from ``ann_file`` at the first loss (a detector built for
        inference or counting needs no training file)."""
        if self._weights is None:
            self._weights = image_count_weights(self.ann_file, self.num_classes, self.freq_weight_power)
        return self._weights

    def get_cls_channels(self, num_classes):
        return num_classes + 1

    def get_activation(self, cls_score):
        scores = cls_score.sigmoid()
        return torch.cat([scores[:, :-1], scores.new_zeros(len(scores), 1)], dim=1)

    def get_accuracy(self, cls_score, labels):
        from mmdet.models.losses import accuracy

        return dict(acc=accuracy(cls_score, labels))

    def forward(self, cls_score, labels, label_weights=None, avg_factor=None, reduction_override=None, **kwargs):
        n, k = len(cls_score), cls_score.shape[1] - 1
        if n == 0:
            return cls_score.sum() * 0
        target = cls_score.new_zeros(n, k + 1)
        target[range(n), labels] = 1
        loss = F.binary_cross_entropy_with_logits(cls_score[:, :-1], target[:, :k], reduction="none")
        classes = fed_loss_classes(labels, self.num_fed_loss_classes, k, self.fed_loss_cls_weights.to(cls_score.device))
        mask = cls_score.new_zeros(k + 1)
        mask[classes] = 1
        return self.loss_weight * torch.sum(loss * mask[:k]) / n
