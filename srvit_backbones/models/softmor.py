"""The SoftMoR unit (paper Algorithm 1): K shared blocks applied for T recursion steps, mixed token-wise by a soft
router computed on the unit's input."""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import drop_path, register_notrace_function
from torch.utils.checkpoint import checkpoint

from .attention import RelPosAttention, grid_attention
from .merge import BipartiteMerge
from .rel_pos import autocast_off
from .rules import check_merge_ratio, check_merging_allowed
from .schedule import Application

AGGREGATIONS = ("soft", "hard", "last")


def apply_block(block: nn.Module, x: torch.Tensor, drop_prob: float, training: bool,
                grid: Optional[Tuple[int, int]] = None, window_size: int = 0,
                attn_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One application of a timm ViT ``Block`` (built with drop_path=0): a shared block runs at several depths, so its
    drop-path rate and window belong to the application. With ``drop_prob=0`` and global attention: ``block(x)``.

    Args:
        x: (B, N, D) tokens.
        drop_prob: the application's stochastic-depth rate.
        training: whether drop-path is active.
        grid: the (h, w) patch grid, for windows and relative positions (``attention.grid_attention``).
        window_size: the application's window; 0: global attention.
        attn_bias: token merging's proportional attention, timm ``Attention``'s ``attn_mask``.

    Raises:
        ValueError: an ``attn_bias`` with windows or relative positions.
    """
    attn = block.attn
    if window_size or isinstance(attn, RelPosAttention):
        if attn_bias is not None:
            check_merging_allowed(bool(window_size), isinstance(attn, RelPosAttention),
                                  what="an attention bias (token merging)")
        y = grid_attention(attn, block.norm1(x), grid, window_size)
    else:
        y = attn(block.norm1(x), attn_mask=attn_bias)
    x = x + drop_path(block.ls1(y), drop_prob, training)
    x = x + drop_path(block.ls2(block.mlp(block.norm2(x))), drop_prob, training)
    return x


@torch.fx.wrap
@register_notrace_function
def router_softmax(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(x W^T + b) over the last dimension in float32 (float64 for a float64 model), also
    under autocast. A leaf for FX (autocast needs the device type, which a traced tensor lacks)."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    if torch.jit.is_scripting():  # TorchScript has no autocast region to leave
        return F.linear(x.to(dtype), weight.to(dtype), bias.to(dtype)).softmax(dim=-1)
    with autocast_off(x.device.type):
        return F.linear(x.to(dtype), weight.to(dtype), bias.to(dtype)).softmax(dim=-1)


class SoftMoRUnit(nn.Module):
    """K distinct blocks applied T times, the T step outputs mixed per token. Windows, relative positions and token
    merging need the patch grid: ``unit(x, grid=(h, w))``.

    Args:
        blocks: the K timm ``Block`` modules (built with drop_path=0).
        applications: K * T ``schedule.Application``s, step-major, as ``Schedule.of_unit`` gives them.
        aggregation: ``soft`` (the method), ``hard`` (each token's top step) or ``last`` (step T, no router).
        step_transforms: a residual Linear(D, D) before every step after the first.
        zero_init: router and step transforms start at zero (uniform mixture, identity), else truncated-normal.
        token_merge_ratio: merge this fraction of the patch tokens at the unit's entry (``merge.BipartiteMerge``).

    Raises:
        ValueError: no blocks, an unknown aggregation, applications out of order, or merging with windows or relative
            positions.
    """

    __jit_ignored_attributes__ = ["applications"]  # Python-side; TorchScript reads the lists derived from it

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        applications: Sequence[Application],
        aggregation: str = "soft",
        step_transforms: bool = True,
        zero_init: bool = True,
        token_merge_ratio: float = 0.0,
    ):
        super().__init__()
        if len(blocks) < 1:
            raise ValueError("a SoftMoR unit needs at least one block")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        self.blocks = nn.ModuleList(blocks)
        self.aggregation = aggregation
        self._run(applications)
        self.grad_checkpointing = False
        self.token_merge_ratio = 0.0
        self.set_token_merge_ratio(token_merge_ratio)

        dim = self.blocks[0].norm1.normalized_shape[0]
        uses_router = self.num_steps > 1 and aggregation != "last"
        self.router = nn.Linear(dim, self.num_steps) if uses_router else None
        self.step_transforms = (
            nn.ModuleList(nn.Linear(dim, dim) for _ in range(self.num_steps - 1))
            if self.num_steps > 1 and step_transforms else None
        )
        self.reset_recursion_parameters(zero_init)

    def _steps_of(self, applications: Sequence[Application]) -> int:
        """T of ``applications``, which must run every block once per step, in order."""
        k = len(self.blocks)
        steps = len(applications) // k
        order = [(a.step, a.block) for a in applications]
        if not applications or order != [(t, j) for t in range(steps) for j in range(k)]:
            raise ValueError(f"a unit of {k} blocks runs each block once per step, in order: its applications' "
                             f"(step, block) must be (0, 0), (0, 1), ..., (T-1, {k - 1}) (Schedule.of_unit gives "
                             f"them), got {order}")
        return steps

    def _run(self, applications: Sequence[Application]):
        """The one writer of what the unit runs: its applications, T, and their rates and windows."""
        self.num_steps = self._steps_of(applications)
        self.applications = tuple(applications)
        self.drop_path_rates = [a.drop_path_rate for a in self.applications]
        self.window_sizes = [a.window_size for a in self.applications]

    @torch.no_grad()
    def reset_recursion_parameters(self, zero_init: bool = True):
        """Router and step transforms at zero (``zero_init``), else truncated-normal of std 0.02; biases at zero."""
        for layer in ([self.router] if self.router is not None else []) + list(self.step_transforms or []):
            if zero_init:
                nn.init.zeros_(layer.weight)
            else:
                nn.init.trunc_normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)

    def set_token_merge_ratio(self, ratio: float):
        """Merge ``ratio`` of the patch tokens at the unit's entry (0 = off; no retraining needed)."""
        ratio = check_merge_ratio(ratio)
        if ratio:
            check_merging_allowed(any(self.window_sizes), any(isinstance(b.attn, RelPosAttention) for b in self.blocks))
        self.token_merge_ratio = ratio

    def check_applications(self, applications: Sequence[Application]):
        """A ValueError for ``applications`` of another T where the parameters depend on T (a router, transforms)."""
        steps = self._steps_of(applications)
        if steps == self.num_steps:
            return
        if self.router is not None:
            raise ValueError(f"this unit's router was trained to mix exactly T={self.num_steps} steps (its weight has "
                             f"one row per step), so T cannot change on the same weights; only 'last' aggregation "
                             f"without step transforms (e.g. bViT) runs at any depth")
        if self.step_transforms is not None:
            raise ValueError(f"this unit has one trained step transform per step (T-1={self.num_steps - 1}), so T "
                             f"cannot change on the same weights; build the model with step_transforms=False")

    def set_applications(self, applications: Sequence[Application]):
        """Run ``applications`` on the same weights (other rates, windows, or T where ``check_applications`` allows)."""
        self.check_applications(applications)
        self._run(applications)

    def truncate(self, applications: Sequence[Application]):
        """Keep only the steps of ``applications`` (a prefix of the unit's) and their transforms."""
        if self.router is not None:
            raise ValueError("a unit with a router mixes all its T steps: its steps cannot be truncated")
        if tuple(applications) != self.applications[:len(applications)]:
            raise ValueError("truncate keeps a prefix of the unit's applications (Schedule.restricted gives it)")
        self._run(applications)
        if self.step_transforms is not None:
            self.step_transforms = self.step_transforms[:self.num_steps - 1] if self.num_steps > 1 else None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def __prepare_scriptable__(self):
        """``torch.jit.script``'s hook: refuses windows, relative positions and merging (global attention only)."""
        if any(self.window_sizes) or any(isinstance(b.attn, RelPosAttention) for b in self.blocks):
            raise RuntimeError("TorchScript supports SR-ViT with global attention only (window_size=0, "
                               "use_rel_pos=False); trace a windowed model with torch.fx, or torch.export at a "
                               "fixed input size")
        if self.token_merge_ratio:
            raise RuntimeError("TorchScript does not support token merging: script the model with "
                               "token_merge_ratio=0 (set_token_merge_ratio(0)), or trace it with torch.fx")
        return self

    def _run_blocks(self, z: torch.Tensor, step: int, grid: Optional[Tuple[int, int]],
                    attn_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        for k, block in enumerate(self.blocks):
            app = step * self.num_blocks + k
            rate, window = self.drop_path_rates[app], self.window_sizes[app]
            if torch.jit.is_scripting():
                # apply_block of a global application: TorchScript cannot pass a module to a function
                z = z + drop_path(block.ls1(block.attn(block.norm1(z))), rate, self.training)
                z = z + drop_path(block.ls2(block.mlp(block.norm2(z))), rate, self.training)
            elif self.grad_checkpointing and torch.is_grad_enabled():
                # non-reentrant, per application: correct with shared parameters (and under DDP)
                z = checkpoint(apply_block, block, z, rate, self.training, grid, window, attn_bias,
                               use_reentrant=False)
            else:
                z = apply_block(block, z, rate, self.training, grid, window, attn_bias)
        return z

    def _step_input(self, h: torch.Tensor, step: int) -> torch.Tensor:
        """The previous step's output through ``step``'s transform if any (a loop: TorchScript indexes a ModuleList by
        literals only)."""
        if self.step_transforms is not None:
            for i, transform in enumerate(self.step_transforms):
                if i == step - 1:
                    h = h + transform(h)
        return h

    def router_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Mixture weights (B, N, T), softmax over steps, in float32 (or float64) even under autocast."""
        return router_softmax(x, self.router.weight, self.router.bias)

    def forward(self, x: torch.Tensor, return_weights: bool = False, grid: Optional[Tuple[int, int]] = None):
        """Run the unit on (B, N, D) tokens over the patch ``grid``; with ``return_weights`` (not under TorchScript),
        also the (B, N, T) weights applied (one-hot for ``hard``, None for ``last`` or T=1)."""
        if not torch.jit.is_scripting():
            if self.token_merge_ratio > 0:
                y, applied, _ = self._recur_merged(x, grid, [])
                return (y, applied) if return_weights else y
        y, applied, _ = self._recur(x, grid, None, [])
        if return_weights and not torch.jit.is_scripting():
            return y, applied
        return y

    @torch.jit.unused
    def forward_steps(self, x: torch.Tensor, steps: List[int],
                      grid: Optional[Tuple[int, int]] = None) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """The unit's output and the outputs of the 0-based recursion ``steps`` (features inside a unit: bViT's)."""
        if self.token_merge_ratio > 0:
            y, _, tapped = self._recur_merged(x, grid, list(steps))
        else:
            y, _, tapped = self._recur(x, grid, None, list(steps))
        return y, tapped

    def _recur(self, x: torch.Tensor, grid: Optional[Tuple[int, int]], attn_bias: Optional[torch.Tensor],
               taps: List[int]) -> Tuple[torch.Tensor, Optional[torch.Tensor], List[torch.Tensor]]:
        """The T steps and their mixture: (output, applied weights or None, outputs of the steps in ``taps``)."""
        tapped: List[torch.Tensor] = []
        if self.router is None:
            h = x
            for t in range(self.num_steps):
                h = self._run_blocks(self._step_input(h, t), t, grid, attn_bias)
                if t in taps:
                    tapped.append(h)
            return h, None, tapped

        alpha = self.router_weights(x)
        applied = alpha
        if self.aggregation == "hard":
            # straight-through: the forward value is the argmax step's output, the router gets the chosen weight's
            # gradient; dividing only the chosen weight (>= 1/T) keeps a saturated router finite
            index = alpha.argmax(dim=-1, keepdim=True)
            applied = torch.zeros_like(alpha).scatter_(-1, index, 1.0)
            chosen = alpha.gather(-1, index)
            weights = applied * (chosen / chosen.detach())
        else:
            weights = alpha
        weights = weights.to(x.dtype)

        # the mixture accumulated in place, one fused op per step: no stack of the T outputs
        h = self._run_blocks(x, 0, grid, attn_bias)
        if 0 in taps:
            tapped.append(h)
        y = weights[..., 0:1] * h
        for t in range(1, self.num_steps):
            h = self._run_blocks(self._step_input(h, t), t, grid, attn_bias)
            if t in taps:
                tapped.append(h)
            y = y.addcmul_(weights[..., t : t + 1], h)
        return y, applied, tapped

    @torch.jit.unused
    def _recur_merged(self, x: torch.Tensor, grid: Optional[Tuple[int, int]],
                      taps: List[int]) -> Tuple[torch.Tensor, Optional[torch.Tensor], List[torch.Tensor]]:
        """``_recur`` on merged tokens with proportional attention through all steps, every output unmerged."""
        if grid is None:
            raise ValueError("token merging needs the patch grid to tell prefix tokens from patches: call the "
                             "unit as unit(x, grid=(h, w)) (SRViT passes it)")
        merge = BipartiteMerge(self.blocks[0].norm1(x), self.token_merge_ratio, x.shape[1] - grid[0] * grid[1])
        y, applied, tapped = self._recur(merge.merge(x), None, merge.attention_bias(x.dtype), taps)
        applied = None if applied is None else merge.unmerge(applied)
        return merge.unmerge(y), applied, [merge.unmerge(h) for h in tapped]

    def extra_repr(self) -> str:
        windows = f", window_sizes={self.window_sizes}" if any(self.window_sizes) else ""
        merge = f", token_merge_ratio={self.token_merge_ratio}" if self.token_merge_ratio else ""
        return (f"K={self.num_blocks}, T={self.num_steps}, aggregation={self.aggregation}, "
                f"step_transforms={self.step_transforms is not None}{windows}{merge}")
