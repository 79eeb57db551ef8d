"""ImageNet pretraining pieces (DeiT recipe) that tools/pretrain.py drives; torch + timm only."""
