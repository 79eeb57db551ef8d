"""ImageNet pretraining pieces (DeiT recipe) that tools/pretrain.py drives; torch + timm only.

Its loaders build timm's RandAugment with a posterize safe for 0 bits (see ``augment``)."""
