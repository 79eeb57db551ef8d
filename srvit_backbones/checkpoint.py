"""Pretrained weights into the core SR-ViT: loaded completely, or a report of what does not fit (docs/checkpoints.md)"""
import importlib.metadata
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import torch
import torch.nn as nn

from .errors import CheckpointError
from .models.factory import set_checkpoint_filter
from .models.rel_pos import is_rel_pos, resize_rel_pos
from .models.rules import is_int_in, split_pos_embed
from .models.srvit import resize_pos_embed, serves_as_is

logger = logging.getLogger(__name__)

HEAD_PREFIXES = ("head.", "head_dist.", "fc_norm.")
#: may be missing without the load being partial: a new classifier or distillation token
OPTIONAL_KEYS = HEAD_PREFIXES + ("dist_token",)
ANCHOR = "patch_embed.proj.weight"
_WRAPPERS = ("module.", "_orig_mod.")  # DDP / torch.compile


def group_keys(keys: Iterable[str]) -> List[str]:
    """A few lines for many keys, detectron2-style: ``units.{1,2}.blocks.* (24)``."""
    groups: Dict[str, List] = {}
    for key in keys:
        m = re.match(r"^units\.(\d+)\.(blocks\.\d+\.attn\.\w+_rel_pos_[hw]$|blocks|router|step_transforms)\b", key)
        if m:
            name = re.sub(r"^blocks\.\d+\.", "blocks.*.", m.group(2)) if is_rel_pos(key) else m.group(2) + ".*"
            entry = groups.setdefault(f"units.{{}}.{name}", [set(), 0])
            entry[0].add(int(m.group(1)))
        else:
            top = key.split(".")[0]
            entry = groups.setdefault(top if top == key else f"{top}.*", [set(), 0])
        entry[1] += 1
    lines = []
    for pattern, (units, count) in groups.items():
        if units:
            ids = sorted(units)
            pattern = pattern.format(ids[0] if len(ids) == 1 else "{" + ",".join(map(str, ids)) + "}")
        lines.append(f"{pattern} ({count})" if count > 1 else pattern)
    return lines


@dataclass
class LoadReport:
    """What happened to every key of a checkpoint."""
    loaded: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)          # model keys not in the checkpoint
    unexpected: List[str] = field(default_factory=list)       # backbone keys the model lacks (e.g. pruned units)
    mismatched: List[str] = field(default_factory=list)       # same key, other shape (skipped)
    dropped: List[str] = field(default_factory=list)          # removed on purpose (classifier)
    outside: List[str] = field(default_factory=list)          # keys outside the backbone (detector, heads)
    notes: List[str] = field(default_factory=list)            # conversions (prefix, key maps, resizes)

    @property
    def required_missing(self) -> List[str]:
        """Missing keys that make the load partial: all but a new classifier and relative-position tables."""
        return [k for k in self.missing if not (k.startswith(OPTIONAL_KEYS) or is_rel_pos(k))]

    @property
    def complete(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors"]
        lines += [f"  note: {n}" for n in self.notes]
        for name, keys in (("MISSING, left at their initialisation", self.required_missing),
                           ("new classifier, left at its initialisation",
                            [k for k in self.missing if k.startswith(OPTIONAL_KEYS)]),
                           ("new relative-position tables, left at zero",
                            [k for k in self.missing if is_rel_pos(k)]),
                           ("shape mismatch, skipped", self.mismatched),
                           ("not in this model, ignored", self.unexpected),
                           ("dropped (a classifier that does not fit, unused ViT blocks)", self.dropped),
                           ("outside the backbone, ignored", self.outside)):
            if keys:
                lines.append(f"  {name}: {len(keys)} tensors: " + ", ".join(group_keys(keys)))
        return "\n".join(lines)


def read_checkpoint(path: str) -> Any:
    """``torch.load`` with ``weights_only=True``, or a ``.safetensors`` file.

    Raises:
        CheckpointError: the file is missing, not a checkpoint, or holds objects torch refuses."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file not found: {path}")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file  # a timm dependency

        return load_file(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):  # torch.save: zip, or legacy pickle
        raise CheckpointError(f"{path} is not a PyTorch checkpoint (it starts with {head!r}; expected a file "
                              f"written by torch.save, or a .safetensors file)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle.UnpicklingError, RuntimeError of a damaged zip, ...
        if "Weights only load failed" not in str(e) and "Unsupported global" not in str(e):
            raise CheckpointError(f"{path} could not be read as a PyTorch checkpoint "
                                  f"({type(e).__name__}: {str(e).splitlines()[0]}); is the file complete?") from e
        unsupported = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if unsupported and _allow_types_of(unsupported.group(1).split(".")[0]):
            return read_checkpoint(path)  # e.g. an mmengine run's checkpoint: its log buffers are allow-listed now
        raise CheckpointError(
            f"{path} holds Python objects ({unsupported.group(1) if unsupported else 'not plain tensors'}) that "
            f"torch refuses to unpickle safely. If you trust the file, re-save only its weights: "
            f"python tools/convert_checkpoint.py {path} OUT.pth --model VARIANT --trust") from None


#: entry points (one per framework package, setup.py) that allow-list the types its checkpoints hold
CHECKPOINT_TYPES_GROUP = "srvit_backbones.checkpoint_types"
_types_loaded = set()


def _allow_types_of(package: str) -> bool:
    """Run the entry point that allow-lists ``package``'s checkpoint types, once; False if none ran."""
    if package in _types_loaded:
        return False
    _types_loaded.add(package)
    points = importlib.metadata.entry_points()
    points = points.select(group=CHECKPOINT_TYPES_GROUP) if hasattr(points, "select") else \
        points.get(CHECKPOINT_TYPES_GROUP, ())  # Python < 3.10
    for point in points:
        if point.name == package:
            try:
                point.load()()
            except ImportError:
                return False
            return True
    return False


def extract_state_dict(obj: Any, prefer_ema: bool = False) -> Dict[str, torch.Tensor]:
    """The weights inside a checkpoint object, DDP / torch.compile prefixes removed."""
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
        raise CheckpointError("the checkpoint holds no tensors (expected a state dict, {'model': ...} or "
                              "{'state_dict': ...})")
    for prefix in _WRAPPERS:
        if all(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix):]: v for k, v in sd.items()}
    return sd


def select_backbone(sd: Dict[str, torch.Tensor], prefix: Optional[str], report: LoadReport) -> Dict[str, torch.Tensor]:
    """The backbone's keys, ``prefix`` (else where ``patch_embed.proj.weight`` sits) removed."""
    if prefix is None:
        found = sorted({k[:-len(ANCHOR)] for k in sd if k.endswith(ANCHOR)})
        if len(found) > 1:
            raise CheckpointError(f"the checkpoint holds several ViTs (under {found}): name the one to load "
                                  f"with prefix=... (mmseg: init_cfg=dict(type='Pretrained', prefix=...))")
        prefix = found[0] if found else ""
    if not prefix:
        return sd
    selected = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    if not selected:
        tops = sorted({k.split(".")[0] + "." for k in sd})
        raise CheckpointError(f"no key of the checkpoint starts with prefix {prefix!r}; its keys start with "
                              f"{', '.join(tops[:10])}")
    report.outside = [k for k in sd if not k.startswith(prefix)]
    report.notes.append(f"took the backbone under {prefix!r}")
    return selected


def map_vit_block_keys(sd: Dict[str, torch.Tensor], model: nn.Module, report: LoadReport,
                       vit_blocks: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
    """timm ViT ``blocks.{i}.*`` -> ``units.{u}.blocks.{k}.*`` (default: the first blocks; one shared: the middle)."""
    pattern = re.compile(r"^blocks\.(\d+)\.(.*)$")
    if not any(pattern.match(k) for k in sd):
        return sd
    names = [f"units.{u}.blocks.{k}" for u, unit in enumerate(model.units) for k in range(len(unit.blocks))]
    n_ckpt = 1 + max(int(pattern.match(k).group(1)) for k in sd if pattern.match(k))
    if vit_blocks is not None:
        chosen = list(vit_blocks)
    else:
        chosen = [n_ckpt // 2] if len(names) == 1 and n_ckpt > 1 else list(range(min(n_ckpt, len(names))))
    bad = [b for b in chosen if not is_int_in(b, 0, n_ckpt)]
    if bad or len(chosen) > len(names):
        raise CheckpointError(f"vit_blocks={list(chosen)}: the checkpoint has blocks 0..{n_ckpt - 1} and the model "
                              f"{len(names)} unique blocks; give at most {len(names)} block numbers in that range")
    target = {b: names[j] for j, b in enumerate(chosen)}
    out = {}
    for k, v in sd.items():
        m = pattern.match(k)
        if m is None:
            out[k] = v
        elif int(m.group(1)) in target:
            out[f"{target[int(m.group(1))]}.{m.group(2)}"] = v
        else:
            report.dropped.append(k)
    seeds = ", ".join(f"blocks.{b} -> {target[b]}" for b in chosen) if len(chosen) <= 2 else \
        f"blocks {chosen} -> the unique blocks in order"
    unused = sorted(set(range(n_ckpt)) - set(chosen))
    report.notes.append(f"mapped a plain ViT checkpoint ({n_ckpt} blocks) onto {len(names)} unique blocks: {seeds}"
                        + (f"; blocks {unused} unused" if unused else ""))
    return out


def adapt_pos_embed(pos_embed: torch.Tensor, model: nn.Module, report: Optional[LoadReport] = None) -> torch.Tensor:
    """Resize a (1, prefix + h*w, D) table to the model's grid and prefix-token count."""
    target = model.pos_embed
    if pos_embed.shape[-1] != target.shape[-1]:
        return pos_embed  # a width mismatch: reported by the shape check
    grid_new = model.pretrain_grid
    n_prefix_new = model.num_prefix_tokens
    n_tokens = pos_embed.shape[1]
    try:
        n_prefix_old, side = split_pos_embed(n_tokens, (n_prefix_new, 1, 2, 0))
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    prefix, grid_tokens = pos_embed[:, :n_prefix_old], pos_embed[:, n_prefix_old:]
    if n_prefix_old != n_prefix_new:
        if n_prefix_old == 0:
            raise CheckpointError("the checkpoint's pos_embed has no class-token entry (a model with windowed "
                                  "attention or relative positions), this model carries a class token: build it "
                                  "with the checkpoint's window_size / use_rel_pos")
        if n_prefix_old > n_prefix_new:
            prefix = prefix[:, :n_prefix_new]
        else:  # e.g. a plain DeiT into a distilled model: the dist token starts from cls
            prefix = torch.cat([prefix, prefix[:, :1].expand(-1, n_prefix_new - n_prefix_old, -1)], dim=1)
        if report is not None:
            report.notes.append(f"pos_embed prefix tokens {n_prefix_old} -> {n_prefix_new}")
    if not serves_as_is([side, side], grid_new):
        grid_tokens = resize_pos_embed(grid_tokens, (side, side), grid_new, model.pos_embed_interp)
        if report is not None:
            report.notes.append(f"pos_embed resized {side}x{side} -> {grid_new[0]}x{grid_new[1]} "
                                f"({model.pos_embed_interp})")
    return torch.cat([prefix, grid_tokens], dim=1)


def convert_state_dict(sd: Dict[str, torch.Tensor], model: nn.Module, report: LoadReport,
                       vit_blocks: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
    """Map keys, resize the position tables, drop the tokens and classifier the model lacks (noted in ``report``)."""
    sd = map_vit_block_keys(dict(sd), model, report, vit_blocks)
    if "pos_embed" in sd:
        sd["pos_embed"] = adapt_pos_embed(sd["pos_embed"], model, report)
    for token in ("cls_token", "dist_token"):
        if token in sd and getattr(model, token, None) is None:
            report.dropped.append(token)
            del sd[token]
    model_sd = model.state_dict()
    for k in [k for k in sd if is_rel_pos(k) and k in model_sd]:
        old, new = sd[k].shape, model_sd[k].shape
        if old[1:] == new[1:] and old[0] != new[0]:  # another window or grid: detectron2's linear resize
            sd[k] = resize_rel_pos(sd[k], new[0])
            report.notes.append(f"{k} resized {old[0]} -> {new[0]} rows")
    for k in [k for k in sd if k.startswith(HEAD_PREFIXES)]:
        if k not in model_sd or model_sd[k].shape != sd[k].shape:
            report.dropped.append(k)
            del sd[k]
    return sd


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: nn.Module,
                         allow_partial: bool = False) -> Dict[str, torch.Tensor]:
    """timm's ``pretrained_filter_fn``; missing backbone weights raise ``CheckpointError`` unless ``allow_partial``."""
    report = LoadReport()
    sd = convert_state_dict(select_backbone(extract_state_dict(state_dict), None, report), model, report)
    model_sd = model.state_dict()
    report.missing = [k for k in model_sd if k not in sd]
    if report.required_missing and not allow_partial:
        raise _partial_error(report, "the pretrained file")
    for k in report.missing:  # new relative-position tables keep their zeros
        if is_rel_pos(k):
            sd[k] = model_sd[k]
    return sd


set_checkpoint_filter(checkpoint_filter_fn)


def _partial_error(report: LoadReport, source: str) -> CheckpointError:
    missing = report.required_missing
    hint = ""
    if any(".router." in k or ".step_transforms." in k for k in missing) and not any(".blocks." in k for k in missing):
        hint = ("Only the recursion parameters (routers, step transforms) are missing, as when a plain ViT "
                "(T=1) initialises a recursive model. ")
    return CheckpointError(
        f"{source} does not hold {len(missing)} of this model's backbone tensors:\n  "
        + "\n  ".join(group_keys(missing) + [f"note: {n}" for n in report.notes])
        + f"\n{hint}Check that the checkpoint belongs to this variant (layout, T); to "
          f"start the missing tensors from their initialisation on purpose, pass allow_partial=True "
          f"(the backbones' allow_partial option in the framework configs; timm: pretrained_strict=False).")


def require_fit(weights: Mapping[str, torch.Tensor], model: nn.Module, source: str, what: str) -> LoadReport:
    """A whole model's trained weights against ``model``.

    Returns:
        The ``LoadReport`` when every tensor fits.
    Raises:
        CheckpointError: naming a few tensors of each kind that does not fit."""
    model_sd = model.state_dict()
    report = LoadReport(mismatched=[k for k, v in weights.items() if k in model_sd and v.shape != model_sd[k].shape])
    report.missing = [k for k in model_sd if k not in weights]
    report.unexpected = [k for k in weights if k not in model_sd]
    report.loaded = [k for k in weights if k in model_sd and k not in report.mismatched]
    if not report.complete:
        shapes = [f"{k} {tuple(weights[k].shape)} vs {tuple(model_sd[k].shape)}" for k in report.mismatched]
        problems = [f"{kind} ({len(keys)}): " + ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
                    for kind, keys in (("another shape, checkpoint vs model", shapes),
                                       ("missing from the checkpoint", report.missing),
                                       ("not in the model", report.unexpected)) if keys]
        raise CheckpointError(f"{source} does not fit {what}:\n  " + "\n  ".join(problems))
    return report


def require_fine_tune_fit(weights: Dict[str, torch.Tensor], model_sd: Mapping[str, torch.Tensor],
                          class_dependent: "re.Pattern", backbones: Mapping[str, bool], log: logging.Logger,
                          source: str, allow_partial_key: str) -> List[str]:
    """A whole detector's or segmentor's checkpoint against the model about to receive it.

    Args:
        weights: the checkpoint's state dict; the class-dependent tensors of another shape are removed.
        class_dependent: matches the names of the layers sized by the number of classes.
        backbones: state-dict prefix of each core model -> its ``allow_partial``.
        source, allow_partial_key: the config keys named in the messages.
    Returns:
        The removed (re-initialised) keys.
    Raises:
        CheckpointError: another tensor of another shape, or backbone tensors missing."""
    mismatched = [k for k, v in weights.items() if k in model_sd and tuple(v.shape) != tuple(model_sd[k].shape)]
    reinitialised = [k for k in mismatched if class_dependent.match(k)]
    others = [k for k in mismatched if k not in reinitialised]
    if others:
        raise CheckpointError(
            f"{len(others)} tensors of {source} have another shape than the model's (only the layers sized by "
            f"the number of classes may differ, for fine-tuning on other classes):\n  "
            + "\n  ".join(f"{k}: checkpoint {tuple(weights[k].shape)} vs model {tuple(model_sd[k].shape)}"
                          for k in others[:8])
            + "\nUse the config the checkpoint was trained with (backbone variant, widths, heads).")
    missing, groups = 0, []
    for prefix, allow_partial in backbones.items():
        if not allow_partial:
            report = LoadReport(missing=[k[len(prefix):] for k in model_sd
                                         if k.startswith(prefix) and k not in weights])
            missing += len(report.required_missing)
            groups += [prefix + k for k in group_keys(report.required_missing)]
    if missing:
        found = sum(1 for k in weights if k in model_sd)
        raise CheckpointError(
            f"{source} does not hold {missing} of the SR-ViT backbone's tensors ({found} of its {len(weights)} "
            f"tensors are this model's):\n  " + "\n  ".join(groups)
            + f"\nIs it an SR-ViT checkpoint of this variant? Give {source} a tools/pretrain.py checkpoint or a "
              f"model trained with this backbone; to start the missing tensors from their initialisation on "
              f"purpose, set {allow_partial_key}.")
    if reinitialised:
        log.warning("Fine-tuning on other classes: %d class-dependent tensors start from their initialisation "
                    "(checkpoint shape -> model shape): %s", len(reinitialised),
                    ", ".join(f"{k} {tuple(weights[k].shape)} -> {tuple(model_sd[k].shape)}" for k in reinitialised))
    for k in reinitialised:
        del weights[k]
    return reinitialised


def load_pretrained(model: nn.Module, checkpoint: Union[str, Mapping[str, Any]], prefer_ema: bool = False,
                    allow_partial: bool = False, prefix: Optional[str] = None, allow_shape_mismatch: bool = False,
                    log: Optional[logging.Logger] = None, vit_blocks: Optional[Sequence[int]] = None) -> LoadReport:
    """Load a checkpoint (path or dict) into an ``SRViT``.

    Args:
        prefer_ema: take the EMA weights when the checkpoint has them.
        allow_partial: let backbone tensors be missing (they keep their initialisation).
        prefix: where the backbone sits in a whole-model checkpoint (default: found by its patch embedding).
        allow_shape_mismatch: skip tensors of another shape instead of raising.
        vit_blocks: the plain-ViT blocks that seed the unique blocks (``map_vit_block_keys``).
    Returns:
        The ``LoadReport``, also logged.
    Raises:
        CheckpointError: a missing or mismatched tensor, unless allowed."""
    log = log or logger
    source = checkpoint if isinstance(checkpoint, str) else "the checkpoint"
    obj = read_checkpoint(checkpoint) if isinstance(checkpoint, str) else checkpoint
    report = LoadReport()
    sd = select_backbone(extract_state_dict(obj, prefer_ema), prefix, report)
    sd = convert_state_dict(sd, model, report, vit_blocks)
    model_sd = model.state_dict()
    mismatched = [k for k, v in sd.items() if k in model_sd and model_sd[k].shape != v.shape]
    if mismatched and not allow_shape_mismatch:
        example, hints, w_ckpt = mismatched[0], [], sd.get(ANCHOR)
        if w_ckpt is not None and w_ckpt.shape[0] != model.embed_dim:
            hints.append(f"the checkpoint's width is {w_ckpt.shape[0]}, the model's {model.embed_dim}")
        steps = {int(v.shape[0]) for k, v in sd.items() if k.endswith("router.weight")}
        if steps and steps != {model.num_steps}:
            hints.append(f"the checkpoint's recursion depth is T={sorted(steps)}, the model's T={model.num_steps}")
        hint = ("; ".join(hints) + ". ") if hints else ""
        raise CheckpointError(
            f"{len(mismatched)} tensors of {source} have another shape than the model's. {hint}"
            f"Use the variant (width, T) the checkpoint was trained with.\n  "
            + "\n  ".join(group_keys(mismatched))
            + f"\n  e.g. {example}: checkpoint {tuple(sd[example].shape)} vs model {tuple(model_sd[example].shape)}")
    report.mismatched = mismatched
    for k in mismatched:
        del sd[k]
    report.missing = [k for k in model_sd if k not in sd]
    report.unexpected = [k for k in sd if k not in model_sd]
    if report.required_missing and not allow_partial:
        raise _partial_error(report, source)
    inside = [k for k in report.unexpected if (m := re.match(r"^units\.(\d+)\.", k))
              and int(m.group(1)) < len(model.units) and not is_rel_pos(k)]  # a layout or recursion mismatch
    if inside and not allow_partial:
        raise CheckpointError(
            f"{source} holds {len(inside)} tensors inside this model's units that the model does not have "
            f"(another layout, T or aggregation?):\n  " + "\n  ".join(group_keys(inside))
            + "\nUse the variant the checkpoint was trained with, or pass allow_partial=True to load the rest.")
    model.load_state_dict({k: v for k, v in sd.items() if k in model_sd}, strict=False)
    report.loaded = [k for k in sd if k in model_sd]
    partial = bool(report.required_missing or report.mismatched)
    log.log(logging.WARNING if partial else logging.INFO, "SR-ViT weights from %s: %s", source, report.summary())
    return report
