"""yacs-config entry point: ``BACKBONE_REGISTRY`` builder and its config keys."""
from detectron2.config import CfgNode as CN
from detectron2.modeling import BACKBONE_REGISTRY, SimpleFeaturePyramid
from detectron2.modeling.backbone.fpn import LastLevelMaxPool

from .backbone import SRViTBackbone


def add_srvit_config(cfg):
    """Add ``MODEL.SRVIT`` (``SRViTBackbone``'s arguments) and ``MODEL.SRVIT.SFP`` (ViTDet's pyramid);
    ``PREFER_EMA`` / ``ALLOW_PARTIAL`` are read by ``SRViTCheckpointer`` (``MODEL.WEIGHTS``)."""
    cfg.MODEL.SRVIT = CN()
    cfg.MODEL.SRVIT.VARIANT = "srvit_s_t3"
    cfg.MODEL.SRVIT.IMG_SIZE = 1024
    cfg.MODEL.SRVIT.DROP_PATH_RATE = 0.1
    cfg.MODEL.SRVIT.USE_ACT_CHECKPOINT = False
    cfg.MODEL.SRVIT.WINDOW_SIZE = 0
    cfg.MODEL.SRVIT.USE_REL_POS = False
    cfg.MODEL.SRVIT.GLOBAL_ATTN_INDEXES = None
    cfg.MODEL.SRVIT.PREFER_EMA = False
    cfg.MODEL.SRVIT.ALLOW_PARTIAL = False
    cfg.MODEL.SRVIT.COMPILE = False
    cfg.MODEL.SRVIT.SFP = CN()
    cfg.MODEL.SRVIT.SFP.OUT_CHANNELS = 256
    cfg.MODEL.SRVIT.SFP.SCALE_FACTORS = [4.0, 2.0, 1.0, 0.5]
    cfg.MODEL.SRVIT.SFP.NORM = "LN"
    cfg.MODEL.SRVIT.SFP.SQUARE_PAD = 1024
    return cfg


@BACKBONE_REGISTRY.register()
def build_srvit_sfp_backbone(cfg, input_shape):
    """SR-ViT + Simple Feature Pyramid (p2-p6), as ViTDet builds it."""
    c = cfg.MODEL.SRVIT
    net = SRViTBackbone(variant=c.VARIANT, img_size=c.IMG_SIZE, drop_path_rate=c.DROP_PATH_RATE,
                        use_act_checkpoint=c.USE_ACT_CHECKPOINT, prefer_ema=c.PREFER_EMA,
                        allow_partial=c.ALLOW_PARTIAL, compile=c.COMPILE, in_chans=input_shape.channels,
                        window_size=c.WINDOW_SIZE, use_rel_pos=c.USE_REL_POS,
                        global_attn_indexes=c.GLOBAL_ATTN_INDEXES)
    return SimpleFeaturePyramid(net=net, in_feature="last_feat", out_channels=c.SFP.OUT_CHANNELS,
                                scale_factors=tuple(c.SFP.SCALE_FACTORS), top_block=LastLevelMaxPool(),
                                norm=c.SFP.NORM, square_pad=c.SFP.SQUARE_PAD)
