"""LVIS pieces of the lvis/ LazyConfigs: ViTDet's fed-loss lambda, and the evaluator under numpy 2."""
import functools

from detectron2.data.detection_utils import get_fed_loss_cls_weights
from detectron2.evaluation import LVISEvaluator

from ..data.lvis import lvis_under_numpy2


def fed_loss_cls_weights(dataset_names, freq_weight_power=0.5):
    """ViTDet's ``lambda: get_fed_loss_cls_weights(names, 0.5)`` as a LazyCall target (saves as yaml)."""
    return functools.partial(get_fed_loss_cls_weights, dataset_names, freq_weight_power)


class SRViTLVISEvaluator(LVISEvaluator):
    """detectron2's ``LVISEvaluator``, evaluating under ``lvis_under_numpy2`` (lvis 0.5.3 fails under numpy 2)."""

    def evaluate(self, *args, **kwargs):
        with lvis_under_numpy2():
            return super().evaluate(*args, **kwargs)
