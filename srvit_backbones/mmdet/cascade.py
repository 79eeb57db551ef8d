"""detectron2's Cascade R-CNN mask branch for mmdet's CascadeRoIHead.

mmdet's CascadeRoIHead builds a mask head per stage, trains each on its stage's samples and
averages the three at test time; detectron2's CascadeROIHeads (ViTDet's cascade) has one mask
head, trained on the first stage's samples (proposals matched at IoU 0.5, as in Mask R-CNN) and
run on the last stage's boxes. ``SingleMaskCascadeRoIHead`` is mmdet's head with that branch:
the same parameters as detectron2's, the same training targets.
"""
from mmdet.models.roi_heads import CascadeRoIHead
from mmdet.registry import MODELS
from mmengine.model import ModuleList


@MODELS.register_module()
class SingleMaskCascadeRoIHead(CascadeRoIHead):
    """CascadeRoIHead with one mask head (detectron2's CascadeROIHeads): its loss from stage 0's
    sampling results only, its prediction on the final boxes."""

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
