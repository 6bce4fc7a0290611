"""One budget for the whole model: what each pruning step aims at and which units it removes to get there.

A budget (`recipe.BudgetSpec`) is a fraction of heads, a fraction of encoder FLOPs, or a speed-up on a named
runtime. `plan_budget` turns it into per-step goals (cumulative): heads removed, FLOPs removed (evenly spread), or
predicted speed-up (spread geometrically, so every step asks the same relative gain). `Budget.select` picks the
units of one step on a common scale: heads by count, importance per FLOP (`selection.select_units`), or importance
per millisecond saved as the latency table predicts it (`by_latency.select_by_latency`; a flat grid cell's 0 ms is
floored to a share of the unit's FLOP-proportional time, so no unit looks free); a member's step measured well past
its target gives units back (`Budget.give_back`, `by_latency.restore_by_latency`).

Several targets (`values`, a model family) share the steps (`selection.family_amounts`): each target is one step's
goal exactly. After every step `Budget.closing` says which targets it closes (their members are taken from it) and
`Budget.next_index` which goal comes next: the same one again while a measured speed-up target is short and has
top-ups left, skipping goals the masks already meet.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from tqdm.auto import tqdm

from compressor.pruning.by_latency import restore_by_latency, select_by_latency, widths_of
from compressor.pruning.latency import Dims, LatencyTable, NarrowTable, Widths, load_file, load_or_build
from compressor.pruning.selection import (
    check_feasible,
    check_flop_budget,
    family_amounts,
    flop_schedule,
    schedule,
    select_heads,
    select_units,
)
from compressor.pruning.units import Masks, UnitPlan
from compressor.pruning.width import width_at, width_grid
from compressor.recipe import BudgetSpec, PruneSpec, RecipeError
from compressor.surgery.arch import config_head_counts, original_ffn_size
from compressor.surgery.cost import UnitCosts, masked_flops, unit_costs

TOP_UP_STEPS = 2  # extra steps a self-measuring speed-up budget may take when its last scheduled one lands short
# A measured speed-up this close below a target meets it: the per-step timing jitters by about that much, so a top-up
# for less buys only noise, at a whole step's cost (the measurements: docs/lab/history.md, "top-ups").
SPEEDUP_SLACK = 0.02
# A speed-up step aims this far past its goal. The latency table's correction is measured on the model of the step
# before, and the table grows optimistic as the model narrows, so landings fall short of the corrected prediction;
# each landing short by more than the slack costs a whole top-up step. Aiming past by the slack turns small shortfalls
# into met targets; a larger error still takes a top-up (measured landings: docs/lab/history.md, SPEEDUP_AIM).
SPEEDUP_AIM = SPEEDUP_SLACK
# A family member's step measured this far past its target gives units of its own step back before its recovery
# (`Budget.give_back`; a whole layer, `GIVE_BACKS`): a step that drops whole layers lands in coarse jumps, and a member
# past its target has lost accuracy it did not need to (measured landings: docs/lab/history.md, "Give-back").
OVERSHOOT = 0.05
# How often a step measured past its target may give back: units first; with none of its own left in a kept layer,
# one whole layer, after which the step selects heads and neurons again (`compressor.recovery.choice.give_back`).
GIVE_BACKS = 2
# A member's measured speed-up is on target when it lies within this fraction of the target, on either side: the
# report's "within 10%" verdict on each member's budget check (`pipeline.measure.member_budget`).
WITHIN = 0.10


def within_target(measured: float, target: float) -> bool:
    """Whether a measured speed-up lies within `WITHIN` of `target`, faster or slower: the one rule the run's report
    and the benchmarks that re-time its members judge a member by."""
    return abs(measured - target) <= WITHIN * target


def check_budget(config, spec: PruneSpec) -> None:
    """Refuse, from the model config alone (before weights load), a head or FLOP budget this model cannot meet."""
    layers, heads = config_head_counts(config)
    budget = spec.resolved_budget
    if budget.kind == "heads":
        check_feasible(layers, heads, budget.value, spec.min_heads_per_layer)
    elif budget.kind == "flops" and "layers" not in spec.units:  # whole layers can remove every FLOP
        shell = SimpleNamespace(config=config)  # the cost and layout helpers read only `.config`
        costs, width = unit_costs(shell, budget.seq_len), original_ffn_size(shell)
        shape = {"heads": (layers, heads), "neurons": (layers, width)}
        units = [unit for unit in spec.units if unit != "hidden"]  # a narrower stream only makes the goal easier
        check_flop_budget(costs, shape, budget.value, units, spec.min_heads_per_layer, spec.uniform_ffn)


def planned_steps(spec: PruneSpec) -> int:
    """Scheduled steps: `spec.steps`, or one per target when a family asks for more targets than that."""
    return max(spec.steps, len(spec.resolved_budget.targets))


def top_ups(spec: PruneSpec) -> int:
    """Extra steps a target may take when the step scheduled to reach it lands short: `TOP_UP_STEPS` for a speed-up
    budget that measures itself (`calibrate`: the table's correction is only known after a step), else none."""
    budget = spec.resolved_budget
    return TOP_UP_STEPS if budget.kind == "speedup" and budget.calibrate else 0


def max_steps(spec: PruneSpec) -> int:
    """The most steps a run can take: the scheduled ones plus every target's top-ups."""
    return planned_steps(spec) + top_ups(spec) * len(spec.resolved_budget.targets)


@dataclass
class Budget:
    """A budget resolved for one model: cumulative per-step goals and what is needed to select against them."""

    model: nn.Module  # the unpruned model the masks are over
    spec: PruneSpec
    goals: list[float]
    costs: UnitCosts
    total_flops: int
    table: LatencyTable | None = None
    calibration: float = 1.0  # measured / predicted speed-up at the last check (`calibrate`); 1 until measured
    members: dict[int, float] = field(default_factory=dict)  # goal index → the target (recipe units) it reaches
    narrow: dict[int, LatencyTable] = field(default_factory=dict)  # units 'hidden': a table per scheduled width

    @property
    def kind(self) -> str:
        return self.spec.resolved_budget.kind

    def table_for(self, alive: Masks) -> LatencyTable | NarrowTable | None:
        """The table that prices `alive`: the full-width one, or where `alive` narrows the residual stream the table
        measured at its width, read against the full-width original (`NarrowTable`). Where the budget holds
        narrower tables, `alive` must be `Masks` at a width it measured: a plain `{kind: mask}` mapping has lost its
        width, and pricing it (or an unmeasured width) at full width would overshoot every later goal."""
        width = getattr(alive, "width", lambda: None)()
        if self.narrow and not isinstance(alive, Masks):
            raise TypeError("budget: this budget prices narrowed widths: pass Masks, not a plain {kind: mask} mapping")
        if self.table is None or width in (None, self.table.dims.hidden):
            return self.table
        if width not in self.narrow:
            raise ValueError(f"budget: no latency table at residual width {width} (measured: {sorted(self.narrow)})")
        return NarrowTable(self.table, self.narrow[width])

    def predicted_speedup(self, alive: Masks) -> float | None:
        """The latency table's speed-up of the masked model over the original (speed-up budgets only)."""
        table = self.table_for(alive)
        if table is None:
            return None
        return table.speedup(table.dims.full(), widths_of(alive, table.dims))

    def expected_speedup(self, alive: Masks) -> float | None:
        """The table's prediction scaled by the last measured correction: what the budget's goals are held to."""
        predicted = self.predicted_speedup(alive)
        return None if predicted is None else predicted * self.calibration

    def calibrate(self, alive: Masks, measured: float) -> float:
        """Record that the model `alive` describes measured `measured`x on the budget's runtime, so later goals
        ask the table for goal / (measured / predicted). Returns the new correction factor."""
        predicted = self.predicted_speedup(alive)
        if predicted is None or not measured > 0:
            raise ValueError(f"budget: calibrate needs a speed-up budget and a positive measurement, got {measured}")
        self.calibration = measured / predicted
        return self.calibration

    def goal(self, index: int) -> float:
        """The cumulative goal at schedule index `index` (0-based; a top-up step repeats its target's index)."""
        return self.goals[min(index, len(self.goals) - 1)]

    def aim(self, index: int) -> float:
        """What a step at goal `index` selects toward: its goal, or under a speed-up budget `SPEEDUP_AIM` past it
        (whether a target is met is still judged against the goal itself)."""
        goal = self.goal(index)
        return goal * (1 + SPEEDUP_AIM) if self.kind == "speedup" else goal

    def reached(self, alive: Masks) -> float:
        """Where `alive` stands on the goals' scale: heads removed, FLOPs removed, or the expected speed-up."""
        if self.kind == "heads":
            return float((~alive["heads"]).sum())
        if self.kind == "flops":
            return float(self.total_flops - Masks.of(alive).flops(self.model, self.costs.seq_len))
        return self.expected_speedup(alive) or 1.0

    def closing(self, index: int, tries: int, closed: list[float], alive: Masks) -> list[float]:
        """The targets a step at goal `index` closes (its members are taken from this step), having run `tries`
        steps at that index: under a speed-up budget every open target the masks are expected to meet, and the
        step's own target once its top-ups are spent (landing short); otherwise exactly the step's own target."""
        own = self.members.get(index)
        if self.kind != "speedup":
            return [own] if own is not None else []
        speed = self.reached(alive)
        out = [t for i, t in sorted(self.members.items()) if t not in closed and self._meets(speed, self.goals[i])]
        if own is not None and own not in closed + out and tries > top_ups(self.spec):
            out.append(own)
        return sorted(out)

    def next_index(self, index: int | None, closed: list[float], alive: Masks) -> int | None:
        """The goal index of the next step after one at `index` (None: before the first), or None when every target
        is closed. An open target is tried again (a top-up); a speed-up budget skips goals the masks already meet."""
        if index is not None and self.members.get(index) is not None and self.members[index] not in closed:
            return index
        speed = self.reached(alive) if self.kind == "speedup" else None
        for i in range(0 if index is None else index + 1, len(self.goals)):
            if speed is None or not self._meets(speed, self.goals[i]):
                return i
        return None

    def index_of(self, steps_log: list[dict]) -> int | None:
        """The goal index of the last finished step in `steps_log` (None before the first); logs written before
        families had one goal per step, then top-ups at the last."""
        if not steps_log:
            return None
        entry = steps_log[-1]
        return entry.get("goal_index", min(entry["step"] - 1, len(self.goals) - 1))

    def tries_at(self, steps_log: list[dict], index: int) -> int:
        """How many of the last finished steps ran at goal `index` (a top-up repeats its target's index)."""
        count = 0
        while count < len(steps_log) and self.index_of(steps_log[: len(steps_log) - count]) == index:
            count += 1
        return count

    def closed_by(self, steps_log: list[dict], alive: Masks) -> list[float]:
        """The targets the finished steps closed. A log from before families (no `goal_index`) had one target,
        closed where the old loop stopped: its goal met, or its top-ups spent."""
        if steps_log and "goal_index" not in steps_log[-1]:
            index = self.index_of(steps_log)
            return self.closing(index, self.tries_at(steps_log, index), [], alive)
        return [t for e in steps_log for t in e.get("members", [])]

    def short_of(self, index: int, alive: Masks) -> bool:
        """Whether a self-measuring speed-up budget's step at goal `index`, a family member's target, is expected
        (after its last measurement) to land short of it: what a step corrects before its recovery."""
        spec = self.spec.resolved_budget
        if self.kind != "speedup" or not spec.calibrate or self.members.get(index) is None:
            return False
        return not self._meets(self.reached(alive), self.goal(index))

    def overshoots(self, index: int, measured: float) -> bool:
        """Whether a self-measuring speed-up budget's step at goal `index`, a family member's target, measured more
        than `OVERSHOOT` past it: what a step gives back before its recovery (`give_back`)."""
        spec = self.spec.resolved_budget
        if self.kind != "speedup" or not spec.calibrate or self.members.get(index) is None:
            return False
        return measured > self.goal(index) * (1 + OVERSHOOT)

    def give_back(self, index: int, scores: dict[str, torch.Tensor], before: Masks, alive: Masks) -> UnitPlan:
        """Units the step removed (alive in `before`, not in `alive`) to put back, most important per millisecond
        added first, while the table, corrected by the step's latest measurement, still predicts `aim(index)`
        (`restore_by_latency`). Empty under other budgets and with equal FFN widths (`uniform_ffn`)."""
        if self.kind != "speedup" or self.table is None or self.spec.uniform_ffn:
            return {kind: {} for kind in alive}
        removed = {kind: before[kind] & ~alive[kind] for kind in alive}
        goal = self.aim(index) / self.calibration  # the table's own scale
        return restore_by_latency({k: v for k, v in scores.items() if k in alive}, alive, removed,
                                  self.table_for(alive), goal, self.costs)  # fmt: skip

    def describe(self, target: float) -> str:
        """A target in words: '2.0x', or '50%' of heads / FLOPs."""
        return f"{target}x" if self.kind == "speedup" else f"{target:.0%}"

    @staticmethod
    def _meets(speed: float, goal: float) -> bool:
        """Whether an expected speed-up meets `goal`, within `SPEEDUP_SLACK` below it."""
        return speed >= goal * (1 - SPEEDUP_SLACK)

    def target_remove(self, step: int, alive: Masks) -> dict[str, int]:
        """Units of each kind in `alive` this step will remove: exactly (head budget, heads only) or estimated from
        the share of cost still to cut, applied to each kind's alive count (FLOP / speed-up budgets). What a
        criterion that aims its sparsity (`l0`) is told for the kind it scores."""
        if self.kind == "heads":
            return {"heads": int(self.goal(step)) - int((~alive["heads"]).sum())}
        if self.kind == "flops":
            left = Masks.of(alive).flops(self.model, self.costs.seq_len)
            share = (self.goal(step) - (self.total_flops - left)) / max(left, 1)
        else:
            share = 1 - (self.expected_speedup(alive) or 1.0) / self.aim(step)
        return {kind: max(0, round(share * int(mask.sum()))) for kind, mask in alive.items()}

    def select(self, step: int, scores: dict[str, torch.Tensor], alive: Masks) -> UnitPlan:
        """The units step `step` (0-based) removes, as a unit plan of new removals."""
        p = self.spec
        if self.kind == "heads":
            n = self.target_remove(step, alive)["heads"]
            return {"heads": select_heads(scores["heads"], alive["heads"], n, p.scope, p.min_heads_per_layer)}
        return self.select_to(self.aim(step), scores, alive)

    def select_to(self, goal: float, scores: dict[str, torch.Tensor], alive: Masks) -> UnitPlan:
        """New removals, among the kinds in `scores`, that reach `goal` (FLOPs removed in all, or a predicted
        speed-up) from `alive`, lowest importance per FLOP or per millisecond first (FLOP / speed-up budgets)."""
        p = self.spec
        if self.kind == "flops":
            removed = self.total_flops - Masks.of(alive).flops(self.model, self.costs.seq_len)
            return select_units(scores, alive, self.costs, int(goal) - removed, p.min_heads_per_layer, p.uniform_ffn)
        goal /= self.calibration  # the table's own scale
        table = self.table_for(alive)
        return select_by_latency(scores, alive, table, goal, self.costs, p.min_heads_per_layer, p.uniform_ffn)

    def intermediate_goals(self, step: int, alive: Masks, parts: int) -> list[float]:
        """`parts` goals evenly spaced from where `alive` stands to what step `step` aims at (the last is its `aim`):
        FLOPs removed spaced linearly, predicted speed-ups geometrically (FLOP / speed-up budgets)."""
        goal = self.aim(step)
        if self.kind == "flops":
            now = self.total_flops - Masks.of(alive).flops(self.model, self.costs.seq_len)
            return [now + (goal - now) * (k + 1) / parts for k in range(parts)]
        now = self.expected_speedup(alive) or 1.0
        return [now * (goal / now) ** ((k + 1) / parts) for k in range(parts)]

    def cost(self, alive: Masks) -> float:
        """What the budget counts for `alive`: encoder FLOPs, or predicted milliseconds under a speed-up budget."""
        table = self.table_for(alive)
        if table is None:
            return float(Masks.of(alive).flops(self.model, self.costs.seq_len))
        widths = widths_of(alive, table.dims)
        return table.model_ms(widths.heads, widths.neurons)

    def progress(self, alive: Masks) -> dict:
        """What the step log records about the budget after a step."""
        left = Masks.of(alive).flops(self.model, self.costs.seq_len)
        out = {"flops_left_fraction": round(left / self.total_flops, 6)}
        if (speedup := self.predicted_speedup(alive)) is not None:
            out["predicted_speedup"] = round(speedup, 4)
            if self.calibration != 1.0:
                out["expected_speedup"] = round(speedup * self.calibration, 4)
        return out


def plan_budget(model: nn.Module, spec: PruneSpec, cache_dir: str | Path | None = None) -> Budget:
    """Resolve `spec`'s budget for `model` (unpruned): per-step goals, unit costs and, for a speed-up budget, the
    latency table (loaded from, or measured into, `cache_dir`, default `$COMPRESSOR_CACHE/latency`; or read from
    the budget's `latency_table` file)."""
    budget = spec.resolved_budget
    if budget.relative_to:  # its multiples are not speed-ups until the reference is timed (`compressor run` does)
        raise RecipeError(
            f"prune.budget.relative_to: '{budget.relative_to}' is measured by `compressor run` before pruning; "
            "expected a budget in speed-ups here (`BudgetSpec.measured_against`)"
        )
    check_budget(model.config, spec)
    costs = unit_costs(model, budget.seq_len)
    total = masked_flops(model, {}, budget.seq_len)
    goals, members = _goals(spec, _heads_total(model) if budget.kind == "heads" else total)
    table, narrow = None, {}
    if budget.kind == "speedup":
        table, narrow = _reachable_tables(Dims.from_config(model.config), spec, len(goals), cache_dir)
    return Budget(model, spec, goals, costs, total, table, members=members, narrow=narrow)


def check_reach(config, spec: PruneSpec, num_labels: int, cache_dir: str | Path | None = None) -> None:
    """A speed-up budget's reach from the model's config alone, before any weights load: one line naming
    `prune.budget.value` when no removal of the recipe's units reaches it (`_check_reachable`), so it fails before
    the base fine-tune rather than after it. The tables it reads are those the steps read (`num_labels`: the
    classifier the run will have, the data's label count), measured into the same cache when absent."""
    budget = spec.resolved_budget
    if budget.kind != "speedup":
        return
    goals, _ = _goals(spec, 0)  # a speed-up's per-step goals need no FLOP or head total
    _reachable_tables(replace(Dims.from_config(config), num_labels=num_labels), spec, len(goals), cache_dir)


def _reachable_tables(dims: Dims, spec: PruneSpec, goals: int, cache_dir) -> tuple[LatencyTable, dict]:
    """(the full-width latency table, `_narrow_tables`) of a speed-up budget: read from its `latency_table` file or
    loaded from (measured into) the cache; raises `_check_reachable`'s error at the narrowest scheduled width."""
    budget = spec.resolved_budget
    args = (dims, budget.runtime, budget.batch_size, budget.seq_len)
    if budget.latency_table:
        table = load_file(budget.latency_table, *args)
    else:
        table = load_or_build(*args, cache_dir=cache_dir)
    narrow = _narrow_tables(table, spec, goals, cache_dir)
    _check_reachable(NarrowTable(table, narrow[min(narrow)]) if narrow else table, spec, budget)
    return table, narrow


def _narrow_tables(table: LatencyTable, spec: PruneSpec, goals: int, cache_dir) -> dict[int, LatencyTable]:
    """Units 'hidden' under a speed-up budget: a table at every width the steps may keep (a named width: those its
    schedule keeps, `pruning.width.width_at`; an allocated one: the whole grid, `width_grid`), measured on the
    budget's runtime like the full-width one (heads at the original head size), cached alike."""
    if "hidden" not in spec.units:
        return {}
    dims, budget = table.dims, spec.resolved_budget
    if spec.hidden_size is None:
        widths = set(width_grid(dims.hidden, None, spec.hidden_multiple))
    else:
        widths = {width_at(dims.hidden, spec.hidden_size, spec.hidden_multiple, i, goals) for i in range(goals)}
    narrow = sorted(widths - {dims.hidden})
    return {
        w: load_or_build(
            replace(dims, hidden=w), budget.runtime, budget.batch_size, budget.seq_len, cache_dir=cache_dir
        )  # fmt: skip
        for w in tqdm(narrow, desc="latency tables (widths)", leave=False)  # each timed once, then cached
    }


def _goals(spec: PruneSpec, total: int) -> tuple[list[float], dict[int, float]]:
    """Cumulative goals per scheduled step (heads removed, FLOPs removed, or speed-up) and the index reaching each
    target. One target keeps the single-run schedules; a family shares the steps among its targets
    (`selection.family_amounts`)."""
    budget = spec.resolved_budget
    if budget.is_family:
        scale = "speedup" if budget.kind == "speedup" else spec.schedule
        amounts, ends = family_amounts(budget.targets, spec.steps, scale)
        goals = [a if budget.kind == "speedup" else float(round(a * total)) for a in amounts]
        return goals, dict(zip(ends, budget.targets, strict=True))
    if budget.kind == "heads":
        goals = [float(g) for g in schedule(total, budget.value, spec.steps, spec.schedule)]
    elif budget.kind == "flops":
        goals = [float(g) for g in flop_schedule(total, budget.value, spec.steps, spec.schedule)]
    else:
        goals = [budget.value ** ((k + 1) / spec.steps) for k in range(spec.steps)]
    return goals, {len(goals) - 1: budget.value}


def _heads_total(model: nn.Module) -> int:
    layers, heads = config_head_counts(model.config)
    return layers * heads


def _check_reachable(table: LatencyTable, spec: PruneSpec, budget: BudgetSpec) -> None:
    """One-line error when even removing every removable unit would not reach the asked speed-up."""
    dims, keep = table.dims, max(spec.min_heads_per_layer, 1 if spec.uniform_ffn else 0)
    neurons = (1 if spec.uniform_ffn else 0) if "neurons" in spec.units else dims.intermediate
    if "layers" in spec.units:  # every layer may go whole: only the outside is left
        keep = neurons = 0
    best = table.speedup(dims.full(), Widths(heads=(keep,) * dims.layers, neurons=(neurons,) * dims.layers))
    if best < budget.value:
        raise RecipeError(
            f"prune.budget.value: a {budget.value}x speed-up on {budget.runtime} is out of reach with units "
            f"{spec.units}; expected ≤ {best:.2f} (the latency table's prediction with every removable unit gone)"
        )
