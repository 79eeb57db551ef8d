"""mmdet's demo (``MMDetAdapter.build_demo``): ``DetInferencer``, COCO category ids of the test set."""
import json
import os

import numpy as np

from ..analysis.demo import DetectionDemo
from .inference import SRViTDetInferencer


class MMDetDemo(DetectionDemo):
    """Args:
        cfg, score_threshold: an mmdet config, an R-CNN's test ``score_thr``.
        checkpoint: tools/train_det.py's iter_N.pth, refused unless it fits the model entirely.
        device, amp, hint: where the model runs, in mixed precision; the fix a refused checkpoint's error names."""

    def __init__(self, cfg, checkpoint: str, device: str = "cpu", amp: bool = False, score_threshold: float = 0.5,
                 hint: str = ""):
        if (cfg.model.get("test_cfg") or {}).get("rcnn") is not None:
            cfg.model.test_cfg.rcnn.score_thr = score_threshold  # what the detector returns at all
        self.inferencer = SRViTDetInferencer.from_file(cfg, checkpoint, device, amp, hint)
        self.category_ids = self._category_ids(cfg, self.inferencer.model.dataset_meta["classes"])
        self.score_threshold = score_threshold

    @staticmethod
    def _category_ids(cfg, classes):
        """Each label's category id in the test set's COCO annotation file; label indices without one."""
        dataset = cfg.test_dataloader.dataset
        ann_file = os.path.join(dataset.get("data_root") or "", dataset.get("ann_file") or "")
        if not os.path.isfile(ann_file):
            print(f"note: {ann_file!r} does not exist: predictions.json gives label indices as category_id")
            return list(range(len(classes)))
        categories = {c["name"]: c["id"] for c in json.load(open(ann_file))["categories"]}
        return [categories.get(name, i) for i, name in enumerate(classes)]

    def predict(self, path):
        """(the image with its predictions drawn, the InstanceData scoring above the threshold)."""
        out = self.inferencer(path, return_vis=True, no_save_vis=True, pred_score_thr=self.score_threshold,
                              return_datasamples=True)
        instances = out["predictions"][0].pred_instances.cpu()
        return out["visualization"][0], instances[instances.scores > self.score_threshold]

    def records(self, instances, image_id, file_name):
        """COCO results (XYWH boxes, RLE masks) with the dataset's category ids."""
        import pycocotools.mask as mask_util

        results = []
        for i in range(len(instances)):
            x0, y0, x1, y1 = instances.bboxes[i].tolist()
            result = dict(image_id=image_id, file_name=file_name, score=float(instances.scores[i]),
                          category_id=self.category_ids[int(instances.labels[i])], bbox=[x0, y0, x1 - x0, y1 - y0])
            if "masks" in instances:
                rle = mask_util.encode(np.asfortranarray(instances.masks[i].numpy().astype(np.uint8)))
                result["segmentation"] = dict(size=rle["size"], counts=rle["counts"].decode("ascii"))
            results.append(result)
        return results
