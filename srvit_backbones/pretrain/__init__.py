"""ImageNet pretraining pieces (DeiT recipe) that tools/pretrain.py drives; torch + timm only.

Importing this package makes timm's RandAugment posterize safe for 0 bits (see ``augment``)."""
from . import augment

augment.install()
