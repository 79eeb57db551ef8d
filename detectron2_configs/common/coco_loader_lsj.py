"""COCO with large-scale jitter (LSJ) at 1024x1024, as ViTDet trains."""
import detectron2.data.transforms as T
from detectron2 import model_zoo
from detectron2.config import LazyCall as L

image_size = 1024
dataloader = model_zoo.get_config("common/data/coco.py").dataloader
dataloader.train.mapper.augmentations = [
    L(T.RandomFlip)(horizontal=True),  # flip first
    L(T.ResizeScale)(min_scale=0.1, max_scale=2.0, target_height=image_size, target_width=image_size),
    L(T.FixedSizeCrop)(crop_size=(image_size, image_size), pad=False),
]
dataloader.train.mapper.image_format = "RGB"
dataloader.train.mapper.recompute_boxes = True  # boxes from the cropped masks
dataloader.train.total_batch_size = 16
dataloader.test.mapper.augmentations = [
    L(T.ResizeShortestEdge)(short_edge_length=image_size, max_size=image_size),
]
dataloader.test.mapper.image_format = "RGB"
