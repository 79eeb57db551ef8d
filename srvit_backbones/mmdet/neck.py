"""ViTDet's Simple Feature Pyramid for MMDetection: detectron2's ``SimpleFeaturePyramid`` layer for layer
(the pip wheel lacks mmdet's ``projects/ViTDet``)."""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule, build_norm_layer
from mmengine.model import BaseModule


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map (detectron2's ``LayerNorm``, eps 1e-6); the output is
    contiguous NCHW, as mmcv's ``RoIAlign`` reads ``data_ptr()`` as NCHW."""

    def __init__(self, num_channels: int, eps: float = 1e-6, **kwargs):
        super().__init__(num_channels, eps=eps, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                            self.eps).permute(0, 3, 1, 2).contiguous()


class SimpleFeaturePyramid(BaseModule):
    """Maps at strides 16/scale for each of ``scale_factors`` from one stride-16 map, plus levels
    max-pooled from the last (detectron2's ``LastLevelMaxPool``): strides 4 to 64 by default.

    Args:
        in_channels: channels of the backbone map.
        out_channels: channels of every output level.
        scale_factors: among 4, 2, 1 and 0.5 (ViTDet's); each followed by a 1x1 and a 3x3 conv.
        num_outs: output levels; those beyond the scale factors are max-pooled.
        in_index: which of the backbone's outputs is the input.
        norm_cfg: norm of the upsampling stage and the convs (default: ``LayerNorm2d``, eps 1e-6).
    """

    def __init__(self, in_channels: int, out_channels: int = 256,
                 scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5), num_outs: int = 5, in_index: int = -1,
                 norm_cfg: Optional[dict] = None, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        norm_cfg = dict(norm_cfg or dict(type="LayerNorm2d"))
        if norm_cfg["type"] == "LayerNorm2d":
            norm_cfg.setdefault("eps", 1e-6)  # detectron2's; mmcv's build_norm_layer would set 1e-5
        if num_outs < len(scale_factors):
            raise ValueError(f"num_outs={num_outs} is fewer than the {len(scale_factors)} scale factors "
                             f"{list(scale_factors)}: drop scale factors or raise num_outs")
        self.in_index = in_index
        self.num_outs = num_outs
        self.scale_factors = tuple(scale_factors)
        self.stages = nn.ModuleList()
        for scale in self.scale_factors:
            if scale == 4.0:
                resample = nn.Sequential(
                    nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2),
                    build_norm_layer(norm_cfg, in_channels // 2)[1], nn.GELU(),
                    nn.ConvTranspose2d(in_channels // 2, in_channels // 4, kernel_size=2, stride=2))
                channels = in_channels // 4
            elif scale == 2.0:
                resample = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
                channels = in_channels // 2
            elif scale == 1.0:
                resample, channels = nn.Identity(), in_channels
            elif scale == 0.5:
                resample, channels = nn.MaxPool2d(kernel_size=2, stride=2), in_channels
            else:
                raise ValueError(f"scale factor {scale} is not supported: choose among 4.0, 2.0, 1.0 and 0.5 "
                                 f"(ViTDet's)")
            self.stages.append(nn.Sequential(
                resample,
                ConvModule(channels, out_channels, 1, norm_cfg=norm_cfg, act_cfg=None),
                ConvModule(out_channels, out_channels, 3, padding=1, norm_cfg=norm_cfg, act_cfg=None)))

    def init_weights(self):
        super().init_weights()
        if self.init_cfg is None:  # detectron2's c2_xavier_fill for the convs (ConvModule's is kaiming)
            for module in self.stages.modules():
                if isinstance(module, ConvModule):
                    nn.init.kaiming_uniform_(module.conv.weight, a=1)
                    if module.conv.bias is not None:
                        nn.init.zeros_(module.conv.bias)

    def forward(self, inputs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        x = inputs[self.in_index]
        outs = [stage(x) for stage in self.stages]
        while len(outs) < self.num_outs:
            outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2))
        # contiguous whatever norm_cfg gives: mmcv's RoIAlign assumes NCHW memory (see LayerNorm2d)
        return tuple(out.contiguous() for out in outs)
