"""detectron2's Cascade R-CNN (ViTDet's cascade) for mmdet's ``CascadeRoIHead``: one mask head (trained on
stage 0's samples, run on the final boxes), the box losses' gradient into the features scaled by 1 / stages,
refined ground-truth boxes kept, and the final boxes scored by the mean of the stages' probabilities
(docs/mmdet.md)."""
import torch
from mmdet.models.roi_heads import CascadeRoIHead
from mmdet.registry import MODELS
from mmengine.model import ModuleList

from .losses import FederatedSigmoidCELoss


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the gradient multiplied by ``scale`` backward."""

    @staticmethod
    def forward(ctx, features, scale):
        ctx.scale = scale
        return features.view_as(features)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


@MODELS.register_module()
class SingleMaskCascadeRoIHead(CascadeRoIHead):
    """CascadeRoIHead trained and scored as detectron2's CascadeROIHeads (see the module)."""

    _fusing_probabilities = False

    def _bbox_forward(self, stage, x, rois) -> dict:
        if self.training:  # RoI pooling is linear: scaling the maps' gradient scales the pooled features'
            x = tuple(_ScaleGradient.apply(level, 1.0 / self.num_stages) for level in x)
        results = super()._bbox_forward(stage, x, rois)
        if self._fusing_probabilities:
            results["cls_score"] = self._probabilities(self.bbox_head[stage], results["cls_score"])
        return results

    def _refine_roi(self, x, rois, batch_img_metas, num_proposals_per_img, **kwargs) -> tuple:
        """mmdet's refinement given each stage's probabilities: it returns the logits of their mean, which the
        last head's activation turns back into that mean."""
        self._fusing_probabilities = True
        try:
            rois, cls_scores, bbox_preds = super()._refine_roi(x, rois, batch_img_metas, num_proposals_per_img,
                                                                **kwargs)
        finally:
            self._fusing_probabilities = False
        return rois, [self._logits(self.bbox_head[-1], p) for p in cls_scores], bbox_preds

    def init_bbox_head(self, bbox_roi_extractor, bbox_head) -> None:
        super().init_bbox_head(bbox_roi_extractor, bbox_head)
        for head in self.bbox_head:
            if not isinstance(head.loss_cls, FederatedSigmoidCELoss) and \
                    (head.custom_activation or getattr(head.loss_cls, "use_sigmoid", False)):
                raise ValueError(
                    f"SingleMaskCascadeRoIHead averages the stages' class probabilities (detectron2's cascade) of "
                    f"softmax cross-entropy or FederatedSigmoidCELoss box heads, not {type(head.loss_cls).__name__}'s: "
                    f"use type='CascadeRoIHead' for other classification losses")

    @staticmethod
    def _probabilities(head, cls_score):
        return cls_score.sigmoid() if isinstance(head.loss_cls, FederatedSigmoidCELoss) else cls_score.softmax(dim=-1)

    @staticmethod
    def _logits(head, probabilities):
        return probabilities.logit() if isinstance(head.loss_cls, FederatedSigmoidCELoss) else probabilities.log()

    def bbox_loss(self, stage, x, sampling_results) -> dict:
        results = super().bbox_loss(stage, x, sampling_results)
        for sampling_result in sampling_results:  # read next by refine_bboxes only, which drops the ones marked
            sampling_result.pos_is_gt = torch.zeros_like(sampling_result.pos_is_gt)
        return results

    def init_mask_head(self, mask_roi_extractor, mask_head) -> None:
        if isinstance(mask_head, list):
            raise ValueError("SingleMaskCascadeRoIHead has one mask head: give mask_head as one config, not a list "
                             "(per-stage mask heads: type='CascadeRoIHead')")
        self.mask_head = ModuleList([MODELS.build(mask_head)])
        if mask_roi_extractor is not None:
            self.share_roi_extractor = False
            self.mask_roi_extractor = ModuleList([MODELS.build(mask_roi_extractor)])
        else:
            self.share_roi_extractor = True
            self.mask_roi_extractor = self.bbox_roi_extractor

    def _mask_forward(self, stage, x, rois) -> dict:
        mask_roi_extractor = self.mask_roi_extractor[0 if not self.share_roi_extractor else stage]
        mask_feats = mask_roi_extractor(x[:mask_roi_extractor.num_inputs], rois)
        return dict(mask_preds=self.mask_head[0](mask_feats))

    def mask_loss(self, stage, x, sampling_results, batch_gt_instances) -> dict:
        if stage > 0:
            return dict(loss_mask={})
        return super().mask_loss(stage, x, sampling_results, batch_gt_instances)

    def predict_mask(self, x, batch_img_metas, results_list, rescale=False):
        stages, self.num_stages = self.num_stages, 1  # the one head, once, on the final boxes
        try:
            return super().predict_mask(x, batch_img_metas, results_list, rescale=rescale)
        finally:
            self.num_stages = stages
