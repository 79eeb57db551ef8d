"""LVIS pieces of the lvis/ LazyConfigs that detectron2's model zoo writes as a lambda."""
import functools

from detectron2.data.detection_utils import get_fed_loss_cls_weights


def fed_loss_cls_weights(dataset_names, freq_weight_power=0.5):
    """The callable FastRCNNOutputLayers' ``get_fed_loss_cls_weights`` takes: ViTDet's
    ``lambda: get_fed_loss_cls_weights(dataloader.train.dataset.names, 0.5)`` (the class weights of
    the federated loss: each class's image count in the datasets' metadata, to the power 0.5), as
    a LazyCall target, so that the config saves as yaml."""
    return functools.partial(get_fed_loss_cls_weights, dataset_names, freq_weight_power)
