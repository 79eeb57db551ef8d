"""LVIS pieces of the lvis/ LazyConfigs: what detectron2's model zoo writes as a lambda, and its
evaluator under numpy 2."""
import functools

from detectron2.data.detection_utils import get_fed_loss_cls_weights
from detectron2.evaluation import LVISEvaluator

from ..lvis import lvis_under_numpy2


def fed_loss_cls_weights(dataset_names, freq_weight_power=0.5):
    """The callable FastRCNNOutputLayers' ``get_fed_loss_cls_weights`` takes: ViTDet's
    ``lambda: get_fed_loss_cls_weights(dataloader.train.dataset.names, 0.5)`` (the class weights of
    the federated loss: each class's image count in the datasets' metadata, to the power 0.5), as
    a LazyCall target, so that the config saves as yaml."""
    return functools.partial(get_fed_loss_cls_weights, dataset_names, freq_weight_power)


class SRViTLVISEvaluator(LVISEvaluator):
    """detectron2's ``LVISEvaluator`` (the lvis/ configs' evaluator), evaluating inside
    ``srvit_backbones.lvis.lvis_under_numpy2``: lvis 0.5.3 fails under numpy 2 otherwise."""

    def evaluate(self, *args, **kwargs):
        with lvis_under_numpy2():
            return super().evaluate(*args, **kwargs)
