"""Loading pretrained weights into the core SR-ViT: unwrap, map keys, resize the position
embedding, and report exactly what did and did not load.

Accepted sources: checkpoints written by ``tools/pretrain.py`` (``{"model": ..., "model_ema":
...}``), plain state dicts, and timm ViT/DeiT state dicts (``blocks.{i}.*``), whose blocks
are mapped onto the units of a T=1 model (or onto the unique blocks of any layout).
Used by timm (``checkpoint_filter_fn``), Detectron2 and MMSegmentation alike.
"""
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

import torch
import torch.nn as nn
from timm.layers import resample_abs_pos_embed

logger = logging.getLogger(__name__)

HEAD_PREFIXES = ("head.", "head_dist.", "fc_norm.")


class CheckpointError(ValueError):
    """A checkpoint cannot be used for this model; the message says why and what to do."""


@dataclass
class LoadReport:
    """What happened to every key of a checkpoint."""
    loaded: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)          # model keys not in the checkpoint
    unexpected: List[str] = field(default_factory=list)       # checkpoint keys the model lacks
    mismatched: List[str] = field(default_factory=list)       # same key, other shape (skipped)
    dropped: List[str] = field(default_factory=list)          # removed on purpose (classifier)
    notes: List[str] = field(default_factory=list)            # conversions (key maps, resizes)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors"]
        lines += [f"  note: {n}" for n in self.notes]
        for name, keys in (("dropped", self.dropped), ("missing (left at init)", self.missing),
                           ("unexpected (ignored)", self.unexpected), ("shape mismatch (skipped)", self.mismatched)):
            if keys:
                lines.append(f"  {name}: {len(keys)}")
                lines += [f"    {k}" for k in keys]
        return "\n".join(lines)


def read_checkpoint(path: str) -> Any:
    """``torch.load`` with torch >= 2.6's safe default (``weights_only=True``)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file not found: {path}") from None
    except Exception as e:  # pickle.UnpicklingError and friends
        if "Weights only load failed" not in str(e) and "Unsupported global" not in str(e):
            raise
        unsupported = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        raise CheckpointError(
            f"{path} holds Python objects ({unsupported.group(1) if unsupported else 'not plain tensors'}) that "
            f"torch refuses to unpickle safely. If you trust the file, re-save only its weights: "
            f"python tools/convert_checkpoint.py {path} OUT.pth --model VARIANT --trust") from None


def extract_state_dict(obj: Any, prefer_ema: bool = False) -> Dict[str, torch.Tensor]:
    """The model weights inside a checkpoint object (pretraining, timm, DeiT, mmengine)."""
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"a checkpoint must be a dict, got {type(obj).__name__}")
    keys = ("model_ema", "state_dict_ema", "model", "state_dict") if prefer_ema else ("model", "state_dict")
    for key in keys:
        if key in obj and isinstance(obj[key], Mapping):
            if prefer_ema and key in ("model", "state_dict"):
                logger.warning("prefer_ema was set but the checkpoint has no EMA weights; using %r", key)
            obj = obj[key]
            break
    sd = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not sd:
        raise CheckpointError("the checkpoint holds no tensors (expected a state dict or {'model': ...})")
    for prefix in ("module.", "_orig_mod."):  # DDP / torch.compile wrappers
        if all(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix):]: v for k, v in sd.items()}
    return sd


def _unit_block_names(model: nn.Module) -> List[str]:
    return [f"units.{u}.blocks.{k}" for u, unit in enumerate(model.units) for k in range(len(unit.blocks))]


def map_vit_block_keys(sd: Dict[str, torch.Tensor], model: nn.Module, report: LoadReport) -> Dict[str, torch.Tensor]:
    """timm ViT/DeiT ``blocks.{i}.*`` -> ``units.{u}.blocks.{k}.*`` (unique blocks in order)."""
    pattern = re.compile(r"^blocks\.(\d+)\.(.*)$")
    if not any(pattern.match(k) for k in sd):
        return sd
    names = _unit_block_names(model)
    n_ckpt = 1 + max(int(pattern.match(k).group(1)) for k in sd if pattern.match(k))
    out = {}
    for k, v in sd.items():
        m = pattern.match(k)
        if m and int(m.group(1)) < len(names):
            out[f"{names[int(m.group(1))]}.{m.group(2)}"] = v
        else:
            out[k] = v
    report.notes.append(f"mapped a plain ViT checkpoint ({n_ckpt} blocks) onto {len(names)} unique blocks")
    return out


def adapt_pos_embed(pos_embed: torch.Tensor, model: nn.Module, report: Optional[LoadReport] = None) -> torch.Tensor:
    """Resize a (1, prefix + h*w, D) table to the model's grid and prefix-token count."""
    target = model.pos_embed
    if pos_embed.shape[-1] != target.shape[-1]:
        return pos_embed  # a width mismatch: reported by the shape check
    grid_new = model.pretrain_grid
    n_prefix_new = model.num_prefix_tokens
    n_tokens = pos_embed.shape[1]
    # find the checkpoint's prefix count: the one that leaves a square grid
    for n_prefix_old in (n_prefix_new, 1, 2, 0):
        side = int(round((n_tokens - n_prefix_old) ** 0.5))
        if side * side == n_tokens - n_prefix_old:
            break
    else:
        raise CheckpointError(f"pos_embed with {n_tokens} tokens is not a square grid plus class tokens")
    prefix, grid_tokens = pos_embed[:, :n_prefix_old], pos_embed[:, n_prefix_old:]
    if n_prefix_old != n_prefix_new:
        if n_prefix_old > n_prefix_new:
            prefix = prefix[:, :n_prefix_new]
        else:  # e.g. a plain DeiT into a distilled model: the dist token starts from cls
            prefix = torch.cat([prefix, prefix[:, :1].expand(-1, n_prefix_new - n_prefix_old, -1)], dim=1)
        if report is not None:
            report.notes.append(f"pos_embed prefix tokens {n_prefix_old} -> {n_prefix_new}")
    if (side, side) != tuple(grid_new):
        grid_tokens = resample_abs_pos_embed(grid_tokens, new_size=list(grid_new), old_size=[side, side],
                                             num_prefix_tokens=0, interpolation="bicubic", antialias=False)
        if report is not None:
            report.notes.append(f"pos_embed resized {side}x{side} -> {grid_new[0]}x{grid_new[1]} (bicubic)")
    return torch.cat([prefix, grid_tokens], dim=1)


def convert_state_dict(sd: Dict[str, torch.Tensor], model: nn.Module,
                       report: Optional[LoadReport] = None) -> Dict[str, torch.Tensor]:
    """Map keys and resize the position embedding of ``sd`` for ``model``."""
    report = report if report is not None else LoadReport()
    sd = map_vit_block_keys(dict(sd), model, report)
    if "pos_embed" in sd:
        sd["pos_embed"] = adapt_pos_embed(sd["pos_embed"], model, report)
    if "dist_token" in sd and getattr(model, "dist_token", None) is None:
        report.dropped.append("dist_token")
        del sd["dist_token"]
    # a classifier the model does not have (a backbone) or of another size is dropped
    model_sd = model.state_dict()
    for k in [k for k in sd if k.startswith(HEAD_PREFIXES)]:
        if k not in model_sd or model_sd[k].shape != sd[k].shape:
            report.dropped.append(k)
            del sd[k]
    return sd


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: nn.Module) -> Dict[str, torch.Tensor]:
    """timm's ``pretrained_filter_fn``: unwrap, map keys, resize pos_embed."""
    sd = extract_state_dict(state_dict)
    return convert_state_dict(sd, model)


def _diagnose(sd: Mapping[str, torch.Tensor], model: nn.Module) -> str:
    hints = []
    w_ckpt = sd.get("patch_embed.proj.weight")
    if w_ckpt is not None and w_ckpt.shape[0] != model.embed_dim:
        hints.append(f"the checkpoint's width is {w_ckpt.shape[0]}, the model's {model.embed_dim}")
    steps = {int(v.shape[0]) for k, v in sd.items() if k.endswith("router.weight")}
    if steps and steps != {model.num_steps}:
        hints.append(f"the checkpoint's recursion depth is T={sorted(steps)}, the model's T={model.num_steps}")
    return ("; ".join(hints) + ". ") if hints else ""


def load_pretrained(model: nn.Module, checkpoint: Union[str, Mapping[str, Any]], prefer_ema: bool = False,
                    allow_shape_mismatch: bool = False, log: Optional[logging.Logger] = None) -> LoadReport:
    """Load a checkpoint (path or dict) into an ``SRViT`` and return/log a ``LoadReport``.

    Tensors whose shape differs after conversion (another width or T) raise a
    ``CheckpointError`` naming them, unless ``allow_shape_mismatch`` (then they are skipped
    and listed). Missing and unexpected keys are listed in the log, never silently ignored.
    """
    log = log or logger
    obj = read_checkpoint(checkpoint) if isinstance(checkpoint, str) else checkpoint
    report = LoadReport()
    sd = convert_state_dict(extract_state_dict(obj, prefer_ema), model, report)
    model_sd = model.state_dict()
    mismatched = [k for k, v in sd.items() if k in model_sd and model_sd[k].shape != v.shape]
    if mismatched and not allow_shape_mismatch:
        details = "\n".join(f"  {k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(model_sd[k].shape)}"
                            for k in mismatched[:20])
        raise CheckpointError(
            f"{len(mismatched)} tensors have another shape than the model's. {_diagnose(sd, model)}"
            f"Use the variant (width, T) the checkpoint was trained with.\n{details}")
    for k in mismatched:
        del sd[k]
    report.mismatched = mismatched
    result = model.load_state_dict(sd, strict=False)
    report.missing = list(result.missing_keys)
    report.unexpected = list(result.unexpected_keys)
    report.loaded = [k for k in sd if k not in report.unexpected]
    level = logging.INFO if report.complete else logging.WARNING
    source = checkpoint if isinstance(checkpoint, str) else "state dict"
    log.log(level, "SR-ViT weights from %s: %s", source, report.summary())
    return report
