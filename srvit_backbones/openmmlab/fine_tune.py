"""``load_from`` checked for fine-tuning, as detectron2's ``SRViTCheckpointer`` does: mmengine loads
non-strictly, so only the layers sized by the number of classes may differ, and the backbone must be
complete unless ``allow_partial``."""
import logging
import re

from mmengine.model import is_model_wrapper

from ..checkpoint import extract_state_dict, read_checkpoint, require_fine_tune_fit
from .backbone import SRViTBackbone

#: mmdet's classifier, box regression and mask logits (per cascade stage), mmseg's classifiers
CLASS_DEPENDENT = re.compile(r"^(roi_head\.(bbox_head(\.\d+)?\.(fc_cls|fc_reg)|mask_head(\.\d+)?\.conv_logits)"
                             r"|(decode_head|auxiliary_head(\.\d+)?)\.conv_seg)\.(weight|bias)$")


def check_load_from(runner, log: logging.Logger = None) -> None:
    """The Runner's ``load_from`` (not a resume) against its model: ``require_fine_tune_fit``."""
    if not runner._load_from or runner._resume:
        return
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    backbones = {f"{name}.srvit." if name else "srvit.": module.allow_partial
                 for name, module in model.named_modules() if isinstance(module, SRViTBackbone)}
    weights = extract_state_dict(read_checkpoint(runner._load_from))
    require_fine_tune_fit(weights, model.state_dict(), CLASS_DEPENDENT, backbones, log or runner.logger,
                          f"load_from={runner._load_from!r}", "model.backbone.allow_partial=True")
