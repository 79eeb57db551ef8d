"""detectron2's demo (``Detectron2Adapter.build_demo``): ``LazyConfigPredictor`` and ``Visualizer``."""
from ..analysis.demo import DetectionDemo, read_weights, refused_unless_it_fits
from .predictor import LazyConfigPredictor


def set_score_threshold(cfg, score_threshold: float) -> None:
    """The test score threshold of the LazyConfig's box predictor, or of each of a cascade's."""
    heads = cfg.model.roi_heads
    for predictor in heads.box_predictors if "box_predictors" in heads else [heads.box_predictor]:
        predictor.test_score_thresh = score_threshold


class Detectron2Demo(DetectionDemo):
    """Args:
        cfg, score_threshold: a LazyConfig, its box predictors' test score threshold.
        checkpoint: tools/train_net.py's model_final.pth, refused unless it fits the model entirely.
        device, amp, hint: where the model runs, in mixed precision; the fix a refused checkpoint's error names."""

    def __init__(self, cfg, checkpoint: str, device: str = "cpu", amp: bool = False, score_threshold: float = 0.5,
                 hint: str = ""):
        set_score_threshold(cfg, score_threshold)
        _, weights = read_weights(checkpoint, "model", "detectron2", hint)
        with refused_unless_it_fits(hint):
            self.predictor = LazyConfigPredictor(cfg, weights, device, amp, source=checkpoint)
        self.score_threshold = score_threshold

    def predict(self, path):
        """(the image with its predictions drawn, the Instances scoring above the threshold)."""
        from detectron2.data import detection_utils
        from detectron2.utils.visualizer import ColorMode, Visualizer

        image = detection_utils.read_image(path, format="BGR")  # what DefaultPredictor takes
        instances = self.predictor(image)["instances"]
        drawn = Visualizer(image[:, :, ::-1], self.predictor.metadata, instance_mode=ColorMode.IMAGE) \
            .draw_instance_predictions(instances).get_image()
        return drawn, instances

    def records(self, instances, image_id, file_name):
        """COCO results (XYWH boxes, RLE masks) with the dataset's category ids."""
        from detectron2.evaluation.coco_evaluation import instances_to_coco_json

        metadata = self.predictor.metadata
        to_dataset_id = {v: k for k, v in getattr(metadata, "thing_dataset_id_to_contiguous_id", {}).items()}
        results = instances_to_coco_json(instances, image_id)
        for r in results:
            r["category_id"] = to_dataset_id.get(r["category_id"], r["category_id"])
            r["file_name"] = file_name
        return results
