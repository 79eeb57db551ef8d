"""The schedule of block applications, SR-ViT's one idea in one list: a few shared blocks applied
T times. Every application says which block of which unit runs at which recursion step, with
which stochastic-depth rate, windowed or global. It is built once from the model's arguments,
and the model, ``set_num_steps``, the default global applications, the relative-position
tables, the feature points and the effective depth all read it.

Applications are numbered in model order, step-major within a unit (unit 1: step 0's blocks
1..K, then step 1's, ...): the order of the drop-path schedule and of ``global_attn_indexes``.
"""
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple


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


@dataclass(frozen=True)
class Schedule:
    """Every block application of a model and the (unit, step) of every feature index (step -1:
    the unit's output)."""

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
        return tuple(a.index for a in self.applications if not a.window_size)

    def extents(self, unit: int, block: int) -> Tuple[int, bool]:
        """(window size of the block's windowed applications or 0, whether it has a global one):
        the relative-position tables the block needs."""
        own = [a.window_size for a in self.applications if a.unit == unit and a.block == block]
        return max(own), not all(own)

    def restricted(self, plan: Plan) -> "Schedule":
        """The schedule of a model cut to ``plan`` (fewer units, fewer steps in the last one):
        the applications and feature points that still run, as they were (rates and windows of
        the whole model)."""
        plan = tuple(plan)

        def runs(unit: int, step: int) -> bool:  # step -1: the unit's output
            return unit < len(plan) and step < plan[unit][1]

        return Schedule(plan, tuple(a for a in self.applications if runs(a.unit, a.step)),
                        tuple((u, t) for u, t in self.features if runs(u, t)))


def unit_plan(layout: Sequence[int], num_steps: int, ordinary_blocks: bool = True) -> List[Tuple[int, int]]:
    """(blocks K, steps T) of every unit: the ordinary first block, the recursive units, the
    ordinary last block (without ``ordinary_blocks``: the recursive units only)."""
    units = [(k, num_steps) for k in layout]
    return [(1, 1)] + units + [(1, 1)] if ordinary_blocks else units


def feature_points(plan: Plan, step_features: bool) -> List[Tuple[int, int]]:
    """(unit, step) of every feature index: each unit's output (step -1), or with
    ``step_features`` each step of each unit (0-based)."""
    if step_features:
        return [(u, t) for u, (_, steps) in enumerate(plan) for t in range(steps)]
    return [(u, -1) for u in range(len(plan))]


def quarter_indices(num_features: int) -> Tuple[int, ...]:
    """The features at 1/4, 1/2, 3/4 and the end of ``num_features``, rounded up (0-based: 2, 5,
    8, 11 of 12; 1, 2, 4, 5 of 6)."""
    return tuple(sorted({math.ceil(num_features * q / 4) - 1 for q in (1, 2, 3, 4)}))


def default_out_indices(layout: Sequence[int], num_steps: int = 1, ordinary_blocks: bool = True,
                        step_features: bool = False) -> Tuple[int, ...]:
    """Dense-prediction default: the recursive units; layers 3/6/9/12 of a plain 12-block ViT;
    with ``step_features`` (bViT) the steps at T/4, T/2, 3T/4 and T."""
    if step_features:
        return quarter_indices(sum(t for _, t in unit_plan(layout, num_steps, ordinary_blocks)))
    if len(layout) == 10 and set(layout) == {1}:
        return (2, 5, 8, 11)
    return tuple(range(1, len(layout) + 1)) if ordinary_blocks else tuple(range(len(layout)))


def default_global_attn_indexes(layout: Sequence[int], num_steps: int, ordinary_blocks: bool = True,
                                step_features: bool = False) -> Tuple[int, ...]:
    """Block applications that stay global when windowed attention is on: the *first*
    application of every unit that ``default_out_indices`` returns (the units that feed the
    dense heads), and the model's last application (``last_feat``, the Simple Feature
    Pyramid's input).

    Why: ViTDet keeps one global block at the end of each quarter of the network (2, 5, 8,
    11), and this rule gives exactly those for the DeiT layout (T=1). In a recursive unit the
    global application comes first, so that every step output the router mixes (all of which
    build on step 1) has exchanged information across the whole image once in this unit; a
    global last application would reach only step T's output. SR-ViT-S T=3: applications
    1, 13, 22, 28, 31 of 32 are global. With ``step_features`` (bViT) the first application
    of every step that ``default_out_indices`` returns stays global (steps 3/6/9/12 of 12).
    """
    plan = unit_plan(layout, num_steps, ordinary_blocks)
    everywhere = build_schedule(plan, 0.0, 0, None, step_features)
    first = {(a.unit, a.step): a.index for a in reversed(everywhere.applications)}
    outs = default_out_indices(layout, num_steps, ordinary_blocks, step_features)
    firsts = {first[unit, max(step, 0)] for unit, step in (everywhere.features[i] for i in outs)}
    return tuple(sorted(firsts | {everywhere.depth - 1}))


def build_schedule(plan: Plan, drop_path_rate: float, window_size: int,
                   global_attn_indexes: Optional[Sequence[int]], step_features: bool) -> Schedule:
    """Every application of ``plan``'s blocks: drop-path rates linear from 0 to
    ``drop_path_rate`` over the effective depth; windows of ``window_size`` except at
    ``global_attn_indexes`` (all global when ``window_size`` is 0)."""
    plan = tuple((k, t) for k, t in plan)
    depth = sum(k * t for k, t in plan)
    wrong = [i for i in global_attn_indexes or () if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < depth]
    if wrong:
        raise ValueError(f"global_attn_indexes {wrong} out of range: this model applies its blocks {depth} times, "
                         f"numbered 0..{depth - 1} (step-major within each unit); pass indices in that range, or "
                         f"None for the default (default_global_attn_indexes)")
    # Python floats: torch.linspace rounds to float32 differently on differently vectorised CPUs
    rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
    stay_global = set(range(depth)) if not window_size else set(global_attn_indexes or ())
    applications = []
    for unit, (k, t) in enumerate(plan):
        for step in range(t):
            for block in range(k):
                i = len(applications)
                applications.append(Application(i, unit, step, block, rates[i],
                                                 0 if i in stay_global else window_size))
    return Schedule(plan, tuple(applications), tuple(feature_points(plan, step_features)))
