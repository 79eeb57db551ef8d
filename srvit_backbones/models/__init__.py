"""The core model: torch + timm only."""
from .factory import VARIANTS, create_srvit, variant_args
from .softmor import SoftMoRUnit, apply_block
from .srvit import ORGANISATIONS, SRViT, default_out_indices, make_layout, resolve_layout

__all__ = ["SRViT", "SoftMoRUnit", "apply_block", "make_layout", "resolve_layout", "default_out_indices",
           "ORGANISATIONS",
           "VARIANTS", "create_srvit", "variant_args"]
