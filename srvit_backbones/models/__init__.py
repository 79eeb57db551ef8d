"""The core model: torch + timm only (nothing else of the package is imported from here)."""
from .attention import RelPosAttention
from .factory import VARIANTS, create_srvit, variant_args
from .schedule import Application, Schedule, build_schedule, default_global_attn_indexes, default_out_indices
from .softmor import SoftMoRUnit, apply_block
from .srvit import ORGANISATIONS, SRViT, make_layout, resolve_layout

__all__ = ["SRViT", "SoftMoRUnit", "apply_block", "make_layout", "resolve_layout", "default_out_indices",
           "default_global_attn_indexes", "RelPosAttention", "ORGANISATIONS",
           "VARIANTS", "create_srvit", "variant_args", "Application", "Schedule", "build_schedule"]
