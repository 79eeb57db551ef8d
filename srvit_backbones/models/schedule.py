"""The schedule of block applications: which block of which unit runs at which recursion step, with which drop-path
rate, windowed or global; the model's one statement of its depth, windows, feature points and recursive units.
Applications are numbered in model order, step-major within a unit (as drop-path rates and ``global_attn_indexes``)."""
import dataclasses
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .rules import check_num_steps, check_window_size, is_int_in

#: (blocks K, steps T) of every unit
Plan = Sequence[Tuple[int, int]]


@dataclass(frozen=True)
class Application:
    """One application of a shared block."""

    index: int  # in model order (what ``global_attn_indexes`` count)
    unit: int
    step: int
    block: int  # the block within its unit
    drop_path_rate: float
    window_size: int  # 0: global attention

    def __post_init__(self):
        check_window_size(self.window_size)


@dataclass(frozen=True)
class Schedule:
    """Every block application of a model, the (unit, step) of every feature index (step -1: the
    unit's output) and the arguments they were made from. ``plan`` is what runs: (K, T) of every
    unit, fewer units or steps once the model is pruned (``restricted``)."""

    layout: Tuple[int, ...]  # sizes K of the recursive units
    num_steps: int  # T of every recursive unit
    ordinary_blocks: bool  # an ordinary first and last block around the recursive units
    step_features: bool  # feature indices count recursion steps (bViT), not units
    drop_path_rate: float
    window_size: int  # 0: global attention everywhere
    default_global: bool  # the global applications are ``default_global_indexes``
    plan: Tuple[Tuple[int, int], ...]
    applications: Tuple[Application, ...]
    features: Tuple[Tuple[int, int], ...]

    @property
    def depth(self) -> int:
        """D_eff: how many block applications one forward pass runs."""
        return len(self.applications)

    def of_unit(self, unit: int) -> Tuple[Application, ...]:
        """The unit's applications, step-major."""
        return tuple(a for a in self.applications if a.unit == unit)

    @property
    def global_indexes(self) -> Tuple[int, ...]:
        """The applications that attend over the whole grid."""
        return tuple(a.index for a in self.applications if not a.window_size)

    @property
    def recursive_units(self) -> Tuple[int, ...]:
        """The units ``num_steps`` sets: all but the ordinary first and last blocks."""
        first = 1 if self.ordinary_blocks else 0
        return tuple(range(first, min(first + len(self.layout), len(self.plan))))

    @property
    def pruned(self) -> bool:
        """Whether units or steps were cut (``restricted``)."""
        return self.plan != tuple(unit_plan(self.layout, self.num_steps, self.ordinary_blocks))

    @property
    def default_feature_indices(self) -> Tuple[int, ...]:
        """The features dense heads take by default (``default_out_indices``; of a pruned model those it still has)."""
        if self.step_features:
            return quarter_indices(len(self.features))
        defaults = default_out_indices(self.layout, self.num_steps, self.ordinary_blocks)
        return tuple(i for i in defaults if i < len(self.features))

    @property
    def default_global_indexes(self) -> Tuple[int, ...]:
        """The applications that stay global by default with windows: the first of every unit (or step) that feeds the
        dense heads, and the model's last (``last_feat``); ViTDet's rule for the DeiT layout (docs/models.md)."""
        first = {}
        for a in self.applications:
            first.setdefault((a.unit, a.step), a.index)
        outs = {first[unit, max(step, 0)] for unit, step in (self.features[i] for i in self.default_feature_indices)}
        return tuple(sorted(outs | {self.depth - 1}))

    def extents(self, unit: int, block: int) -> Tuple[int, bool]:
        """(window of the block's windowed applications or 0, whether it has a global one): the tables it needs."""
        own = [a.window_size for a in self.applications if a.unit == unit and a.block == block]
        return max(own), not all(own)

    def restricted(self, plan: Plan) -> "Schedule":
        """The schedule of a model cut to ``plan``: the applications and feature points that still run."""
        plan = tuple(plan)

        def runs(unit: int, step: int) -> bool:  # step -1: the unit's output
            return unit < len(plan) and step < plan[unit][1]

        return dataclasses.replace(self, plan=plan,
                                   applications=tuple(a for a in self.applications if runs(a.unit, a.step)),
                                   features=tuple((u, t) for u, t in self.features if runs(u, t)))

    def with_num_steps(self, num_steps: int) -> "Schedule":
        """The same units run ``num_steps`` times each (``SRViT.set_num_steps``); a ValueError where the global
        applications were given explicitly or the model is pruned (they number another depth)."""
        check_num_steps(num_steps)
        if self.window_size and (self.pruned or not self.default_global):
            raise ValueError("global_attn_indexes number the block applications of one depth; build the model "
                             "with the new num_steps (and its own global_attn_indexes): the checkpoint loads unchanged")
        plan = [(k, num_steps if u in self.recursive_units else t) for u, (k, t) in enumerate(self.plan)]
        return _laid_out(dataclasses.replace(self, num_steps=num_steps), plan, None)


def unit_plan(layout: Sequence[int], num_steps: int, ordinary_blocks: bool = True) -> List[Tuple[int, int]]:
    """(K, T) of every unit: the ordinary first block, the recursive units, the ordinary last block (if any)."""
    units = [(k, num_steps) for k in layout]
    return [(1, 1)] + units + [(1, 1)] if ordinary_blocks else units


def feature_points(plan: Plan, step_features: bool) -> List[Tuple[int, int]]:
    """(unit, step) of every feature index: each unit's output (step -1), or each step with ``step_features``."""
    if step_features:
        return [(u, t) for u, (_, steps) in enumerate(plan) for t in range(steps)]
    return [(u, -1) for u in range(len(plan))]


def quarter_indices(num_features: int) -> Tuple[int, ...]:
    """The features at 1/4, 1/2, 3/4 and the end of ``num_features``, rounded up (0-based: 2, 5, 8, 11 of 12)."""
    return tuple(sorted({math.ceil(num_features * q / 4) - 1 for q in (1, 2, 3, 4)}))


#: dense heads take this many features (a Simple Feature Pyramid's or UPerNet's four levels)
DENSE_LEVELS = 4


def default_out_indices(layout: Sequence[int], num_steps: int = 1, ordinary_blocks: bool = True,
                        step_features: bool = False) -> Tuple[int, ...]:
    """The feature indices dense heads take by default.

    Args:
        layout, num_steps, ordinary_blocks, step_features: the model's (``SRViT``'s).

    Returns:
        The recursive units where there are at most DENSE_LEVELS (SR-ViT), else the features at the quarters of the
        network, ViTDet's rule (DeiT's layers, bViT's steps 3/6/9/12).
    """
    plan = unit_plan(layout, num_steps, ordinary_blocks)
    if step_features:
        return quarter_indices(sum(t for _, t in plan))
    first = 1 if ordinary_blocks else 0
    if len(layout) <= DENSE_LEVELS:
        return tuple(range(first, first + len(layout)))
    return quarter_indices(len(plan))


def default_global_attn_indexes(layout: Sequence[int], num_steps: int, ordinary_blocks: bool = True,
                                step_features: bool = False) -> Tuple[int, ...]:
    """The block applications that stay global by default (``Schedule.default_global_indexes``
    says which and why), for a model of these arguments."""
    return build_schedule(layout, num_steps, ordinary_blocks, step_features).default_global_indexes


def build_schedule(layout: Sequence[int], num_steps: int, ordinary_blocks: bool = True, step_features: bool = False,
                   drop_path_rate: float = 0.0, window_size: int = 0,
                   global_attn_indexes: Optional[Sequence[int]] = None) -> Schedule:
    """The schedule of a model.

    Args:
        layout, num_steps, ordinary_blocks, step_features: the model's (``SRViT``'s).
        drop_path_rate: the last application's rate (linear from 0 over the effective depth).
        window_size: windows of every application but the global ones; 0: all global.
        global_attn_indexes: the global applications; None: ``Schedule.default_global_indexes``.

    Raises:
        ValueError: T < 1, a negative window, or a global index out of range.
    """
    check_num_steps(num_steps)
    check_window_size(window_size)
    given = None if global_attn_indexes is None else list(global_attn_indexes)
    schedule = Schedule(tuple(layout), num_steps, ordinary_blocks, step_features, drop_path_rate, window_size,
                        given is None, (), (), ())
    return _laid_out(schedule, unit_plan(layout, num_steps, ordinary_blocks), given)


def _laid_out(schedule: Schedule, plan: Plan, global_attn_indexes: Optional[List[int]]) -> Schedule:
    """``schedule`` with the applications and features of ``plan``: all global first, then the windows."""
    plan = tuple((k, t) for k, t in plan)
    depth = sum(k * t for k, t in plan)
    wrong = [i for i in global_attn_indexes or () if not is_int_in(i, 0, depth)]
    if wrong:
        raise ValueError(f"global_attn_indexes {wrong} out of range: this model applies its blocks {depth} times, "
                         f"numbered 0..{depth - 1} (step-major within each unit); pass indices in that range, or "
                         f"None for the default (default_global_attn_indexes)")
    # Python floats: torch.linspace rounds to float32 differently on differently vectorised CPUs
    rate = schedule.drop_path_rate
    structure = [(unit, step, block) for unit, (k, t) in enumerate(plan) for step in range(t) for block in range(k)]
    applications = tuple(Application(i, u, t, b, rate * i / max(depth - 1, 1), 0)
                         for i, (u, t, b) in enumerate(structure))
    schedule = dataclasses.replace(schedule, plan=plan, applications=applications,
                                   features=tuple(feature_points(plan, schedule.step_features)))
    if not schedule.window_size:
        return schedule
    stay_global = set(schedule.default_global_indexes if global_attn_indexes is None else global_attn_indexes)
    return dataclasses.replace(schedule, applications=tuple(
        a if a.index in stay_global else dataclasses.replace(a, window_size=schedule.window_size)
        for a in applications))
