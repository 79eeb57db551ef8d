"""detectron2's LVIS classification loss for mmdet's box heads: sigmoid cross-entropy with the federated
loss (Zhou et al., 2021), as FastRCNNOutputLayers computes it with ``use_sigmoid_ce=True, use_fed_loss=True``
(docs/mmdet.md)."""
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


def image_count_weights(image_counts, num_classes, freq_weight_power):
    """detectron2's get_fed_loss_cls_weights: each class's image count (at least 1) to ``freq_weight_power``."""
    from ..data.lvis import class_image_counts

    counts = torch.tensor([max(c, 1) for c in class_image_counts(image_counts, num_classes)], dtype=torch.float)
    return counts ** freq_weight_power


@MODELS.register_module()
class FederatedSigmoidCELoss(nn.Module):
    """Sigmoid CE + federated loss for a box head's ``loss_cls`` (K + 1 logits, through mmdet's
    custom-activation hooks).

    Args:
        image_counts: ``'lvis_v1'`` (shipped counts) or an LVIS-format training file.
        num_classes: K (1203 for LVIS v1).
        freq_weight_power: the weights' power (detectron2's 0.5).
        num_fed_loss_classes: classes counted per batch (detectron2's 50).
    """

    custom_cls_channels = True
    custom_activation = True
    custom_accuracy = True
    use_sigmoid = True

    def __init__(self, image_counts="lvis_v1", num_classes=1203, freq_weight_power=0.5, num_fed_loss_classes=50,
                 loss_weight=1.0):
        super().__init__()
        self.num_classes, self.num_fed_loss_classes, self.loss_weight = num_classes, num_fed_loss_classes, loss_weight
        self.image_counts, self.freq_weight_power = image_counts, freq_weight_power
        self._weights = None

    @property
    def fed_loss_cls_weights(self):
        """The class weights, made at the first loss (inference needs no training file)."""
        if self._weights is None:
            self._weights = image_count_weights(self.image_counts, self.num_classes, self.freq_weight_power)
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
