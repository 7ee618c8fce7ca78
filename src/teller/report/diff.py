"""`teller diff`: two runs compared step kind by step kind and operator by operator.

A person who changed a kernel, a driver or a config wants to know three things: did steps get
slower, which kind of step (prefill, decode, mixed), and which operators account for it. Runs rarely
batch the same requests, so step times are also compared per batched token when the batch
composition differs; operators are compared per unit of work (a step an engine marked, else an
iteration teller found, else a second of wall time, with a warning), so two runs of different
lengths still line up. The result is plain data (dataclasses and an Arrow table) that the terminal,
markdown and JSON renderers, and CI through `--fail-on-regression`, all read.

A comparison CI can trust also says when it is no comparison at all: runs with no step kind in
common, or recorded on different ranks or world sizes, are `not_comparable` (exit 3 in the CLI),
so a wrong pairing never passes the gate silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from teller.callchain.render import format_ns, short_name
from teller.callchain.steps import FOUND_BY_ENGINE, FOUND_BY_PROFILER_STEP, FOUND_BY_REGEX
from teller.ingest.schema import LAYER_CODE, LAYERS
from teller.report.console import COLUMN_GAP, PLAIN, Look, table_lines, wrapped

if TYPE_CHECKING:
    from teller.callchain.tree import CallTree
    from teller.ingest.schema import SourceInfo

DIFF_SCHEMA_VERSION = "teller.diff/2"

#: Median tokens per step may differ by this share before steps are compared per token instead.
COMPOSITION_TOLERANCE = 0.10
#: A change in mean iteration time smaller than this share of A's is noise: no operator shares.
STEP_CHANGE_FLOOR = 0.005
#: Operators named in the verdict as explaining the difference.
EXPLAINING_OPERATORS = 3
#: Width operator names are cut to in the terminal and markdown tables (unless two would collide).
NAME_WIDTH = 70
#: The narrowest an operator name is cut to in the terminal table, however narrow the terminal.
MIN_NAME_WIDTH = 24
#: Layers left out of the operator comparison: requests span many steps; steps are the unit itself.
_NOT_OPERATORS = frozenset({LAYER_CODE["request"]})
#: Rules whose steps are the engine's own (a step); the others find iterations in the trace.
_MARKED_STEPS = frozenset({FOUND_BY_ENGINE, FOUND_BY_PROFILER_STEP, FOUND_BY_REGEX})

UNIT_STEP = "step"
UNIT_ITERATION = "iteration"
UNIT_WALL_SECOND = "second of wall time"


@dataclass
class RunShape:
    """What decides whether two runs can be compared: their ranks, world size and unit of work."""

    ranks: list[int]
    world_size: int  # 0: the traces do not say
    found_by: list[str]  # how the run's steps were found (StepTable.found_by), distinct
    unit: str  # UNIT_*: what the operator columns are "per"
    units: float  # how many of them the run holds (steps, iterations or seconds)


@dataclass
class KindDiff:
    """One step kind on both sides: how many steps, their median and p90 time, per token too."""

    kind: str
    a_steps: int
    b_steps: int
    a_median_ns: int
    b_median_ns: int
    a_p90_ns: int
    b_p90_ns: int
    a_median_tokens: float  # batched tokens per step (-1: the step annotations do not say)
    b_median_tokens: float
    a_median_ns_per_token: float  # NaN without token counts
    b_median_ns_per_token: float
    metric: str  # what change_pct compares: "median step time" or "median time per token"
    change_pct: float  # B against A in that metric; NaN when a side has no step of this kind

    def regressed(self, threshold_pct: float) -> bool:
        return bool(np.isfinite(self.change_pct) and self.change_pct > threshold_pct)


@dataclass
class RunDiff:
    """Run B against run A: per step kind, per operator, and the operators that explain it."""

    a_inputs: list[str]
    b_inputs: list[str]
    a_shape: RunShape
    b_shape: RunShape
    kinds: list[KindDiff]
    operators: pa.Table  # one row per (layer, operator name); see `operator_table`
    a_step_ns: float  # mean iteration time over all steps (NaN without steps)
    b_step_ns: float
    explaining: list[str]  # operator names, largest increase in self time per unit first
    summary: str
    schema: str = DIFF_SCHEMA_VERSION
    notes: list[str] = field(default_factory=list)
    #: Why the runs cannot be compared; empty when they can. A gate must not pass such a diff.
    not_comparable: list[str] = field(default_factory=list)

    @property
    def unit(self) -> str:
        """What the operator columns are per: the coarser of the two sides' units."""
        return self.a_shape.unit if self.a_shape.unit == self.b_shape.unit else UNIT_WALL_SECOND

    def regressions(self, threshold_pct: float) -> list[KindDiff]:
        return [k for k in self.kinds if k.regressed(threshold_pct)]

    def to_json(self, top_operators: int = 50) -> dict:
        document = asdict(self)
        document["unit"] = self.unit
        document["operators"] = self.operators.slice(0, top_operators).to_pylist()
        for key in ("a_step_ns", "b_step_ns"):
            document[key] = _finite_or_none(document[key])
        for rows in (document["kinds"], document["operators"]):
            for row in rows:  # JSON has no NaN: absent numbers are null
                for key, value in row.items():
                    row[key] = _finite_or_none(value)
        return document


def _finite_or_none(value: object) -> object:
    return None if isinstance(value, float) and not np.isfinite(value) else value


def compare(
    a: CallTree,
    b: CallTree,
    a_inputs: list[str],
    b_inputs: list[str],
    a_sources: Sequence[SourceInfo] = (),
    b_sources: Sequence[SourceInfo] = (),
    allow_mismatch: bool = False,
) -> RunDiff:
    """Compare run B's tree against run A's (A is the reference); the inputs name their files.

    The sources (the readers' facts about each file) give the world size; without them only the
    ranks present in the trees are checked. `allow_mismatch` turns a difference in ranks or world
    size from a reason the runs are not comparable into a note.
    """
    a_shape, b_shape = run_shape(a, a_sources), run_shape(b, b_sources)
    a_iter, b_iter = _iterations(a), _iterations(b)
    kinds = [_kind_diff(kind, a_iter, b_iter) for kind in _kinds(a_iter, b_iter)]
    a_step_ns = float(a_iter["dur_ns"].mean()) if len(a_iter["dur_ns"]) else float("nan")
    b_step_ns = float(b_iter["dur_ns"].mean()) if len(b_iter["dur_ns"]) else float("nan")
    step_change_ns = b_step_ns - a_step_ns
    if not abs(step_change_ns) > STEP_CHANGE_FLOOR * a_step_ns:
        step_change_ns = float("nan")  # unchanged (or unknown): shares of it would be noise
    same_unit = a_shape.unit == b_shape.unit
    operators = operator_table(a, b, step_change_ns, wall_time=not same_unit)
    notes = _notes(a_shape, b_shape)
    problems = _comparability(a_shape, b_shape, kinds, operators)
    mismatch = _mismatch(a_shape, b_shape)
    if allow_mismatch:
        notes.extend(f"{m} (compared anyway: --allow-mismatch)" for m in mismatch)
    else:
        problems.extend(f"{m} (pass --allow-mismatch to compare anyway)" for m in mismatch)
    diff = RunDiff(
        a_inputs=a_inputs,
        b_inputs=b_inputs,
        a_shape=a_shape,
        b_shape=b_shape,
        kinds=kinds,
        operators=operators,
        a_step_ns=a_step_ns,
        b_step_ns=b_step_ns,
        explaining=_explaining(operators),
        summary="",
        notes=notes,
        not_comparable=problems,
    )
    diff.summary = _summary(diff)
    return diff


def run_shape(tree: CallTree, sources: Sequence[SourceInfo] = ()) -> RunShape:
    """The run's ranks, world size, and the unit its operators are counted per."""
    steps = tree.steps
    found_by = sorted(set(steps.found_by))
    sizes = {s.world_size for s in sources if s.world_size > 0}
    world_size = max(sizes) if sizes else 0
    if len(steps):
        unit = UNIT_STEP if set(found_by) <= _MARKED_STEPS else UNIT_ITERATION
        units = float(len(np.unique(np.asarray(steps.index))))
    else:
        unit, units = UNIT_WALL_SECOND, _wall_seconds(tree)
    ranks = sorted(set(np.asarray(tree.rank).tolist()))
    return RunShape(ranks, world_size, found_by, unit, units)


def _wall_seconds(tree: CallTree) -> float:
    """The run's span on its slowest rank, in seconds (at least a nanosecond)."""
    if not len(tree):
        return 1e-9
    ends = np.asarray(tree.start) + np.asarray(tree.dur)
    ranks = np.asarray(tree.rank)
    spans = [
        ends[ranks == r].max() - np.asarray(tree.start)[ranks == r].min() for r in np.unique(ranks)
    ]
    return max(float(max(spans)), 1.0) / 1e9


def _notes(a: RunShape, b: RunShape) -> list[str]:
    notes = []
    for side, shape in (("A", a), ("B", b)):
        if shape.unit == UNIT_WALL_SECOND:
            notes.append(f"run {side} has no steps: operators are compared per second of wall time")
        elif shape.unit == UNIT_ITERATION:
            notes.append(
                f"run {side} has no step annotations: its steps are iterations found by "
                + ", ".join(shape.found_by)
            )
    if a.unit != b.unit and UNIT_WALL_SECOND not in (a.unit, b.unit):
        notes.append(
            f"A counts {a.unit}s and B {b.unit}s: operators are compared per second of wall time"
        )
    return notes


def _comparability(
    a: RunShape, b: RunShape, kinds: list[KindDiff], operators: pa.Table
) -> list[str]:
    """Reasons no verdict on B against A would mean anything (the gate must not pass)."""
    problems = []
    if a.unit != UNIT_WALL_SECOND and b.unit != UNIT_WALL_SECOND:
        if not any(k.a_steps and k.b_steps for k in kinds):
            a_kinds = sorted({k.kind for k in kinds if k.a_steps})
            b_kinds = sorted({k.kind for k in kinds if k.b_steps})
            problems.append(
                f"no step kind in common (A: {', '.join(a_kinds)}; B: {', '.join(b_kinds)})"
            )
    else:
        problems.append("a run has no steps: step times cannot be compared")
    a_calls = np.asarray(operators.column("a_calls_per_unit"))
    b_calls = np.asarray(operators.column("b_calls_per_unit"))
    if not ((a_calls > 0) & (b_calls > 0)).any():
        problems.append("no operator in common")
    return problems


def _mismatch(a: RunShape, b: RunShape) -> list[str]:
    """Differences in where the runs were recorded, which make a comparison suspect."""
    found = []
    if a.world_size and b.world_size and a.world_size != b.world_size:
        found.append(f"world sizes differ (A: {a.world_size}, B: {b.world_size})")
    if a.ranks != b.ranks:
        found.append(f"ranks differ (A: {_ranks_text(a.ranks)}; B: {_ranks_text(b.ranks)})")
    return found


def _ranks_text(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return (
        f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}" + ("…" if len(ranks) > 8 else "")
    )


def _iterations(tree: CallTree) -> dict[str, np.ndarray]:
    """One row per iteration (step ordinal): its kind, time (slowest rank) and batched tokens.

    On tensor-parallel ranks the same iteration ends when its slowest rank does, so an iteration's
    time is the longest of its ranks' step durations.
    """
    steps = tree.steps
    if not len(steps):
        empty = np.zeros(0, dtype=np.int64)
        return {"index": empty, "dur_ns": empty, "tokens": empty, "kind": np.array([], dtype=str)}
    index = np.asarray(steps.index)
    ordinals, first = np.unique(index, return_index=True)
    dur_ns = np.zeros(len(ordinals), dtype=np.int64)
    np.maximum.at(dur_ns, np.searchsorted(ordinals, index), np.asarray(steps.dur_ns))
    context = np.asarray(steps.context_tokens)[first]
    generation = np.asarray(steps.generation_tokens)[first]
    known = (context >= 0) | (generation >= 0)
    tokens = np.where(known, np.maximum(context, 0) + np.maximum(generation, 0), -1)
    kind = np.array(steps.kind, dtype=object)[first].astype(str)
    return {"index": ordinals, "dur_ns": dur_ns, "tokens": tokens, "kind": kind}


def _kinds(a_iter: dict, b_iter: dict) -> list[str]:
    order = ("prefill", "mixed", "decode")
    present = set(a_iter["kind"].tolist()) | set(b_iter["kind"].tolist())
    return [k for k in order if k in present] + sorted(present - set(order))


def _kind_diff(kind: str, a_iter: dict, b_iter: dict) -> KindDiff:
    def side(it: dict) -> tuple[int, int, int, float, float]:
        chosen = it["kind"] == kind
        dur = it["dur_ns"][chosen]
        if not len(dur):
            return 0, 0, 0, -1.0, float("nan")
        tokens = it["tokens"][chosen]
        with_tokens = tokens > 0
        per_token = (
            float(np.median(dur[with_tokens] / tokens[with_tokens]))
            if with_tokens.any()
            else float("nan")
        )
        return (
            len(dur),
            int(np.median(dur)),
            int(np.percentile(dur, 90)),
            float(np.median(tokens)) if with_tokens.all() else -1.0,
            per_token,
        )

    a_n, a_med, a_p90, a_tok, a_per = side(a_iter)
    b_n, b_med, b_p90, b_tok, b_per = side(b_iter)
    composition_differs = (
        a_tok > 0 and b_tok > 0 and abs(b_tok - a_tok) > COMPOSITION_TOLERANCE * a_tok
    )
    if composition_differs and np.isfinite(a_per) and np.isfinite(b_per):
        metric, change = "median time per token", _pct(b_per, a_per)
    else:
        metric, change = "median step time", _pct(b_med, a_med) if a_n and b_n else float("nan")
    return KindDiff(
        kind, a_n, b_n, a_med, b_med, a_p90, b_p90, a_tok, b_tok, a_per, b_per, metric, change
    )


def _pct(new: float, old: float) -> float:
    return 100.0 * (new - old) / old if old > 0 else float("nan")


def _operator_totals(
    tree: CallTree, wall_time: bool
) -> tuple[dict[tuple[int, str], tuple[int, int]], float]:
    """Self time and calls per (layer, name), and the number of units they are shared over.

    Inside steps the step annotation nodes themselves are left out (their names carry the batch,
    so no two match) and the units are the run's iterations; a run without steps, or one compared
    by wall time, counts all its nodes per second of its span.
    """
    steps = tree.steps
    if len(steps) and not wall_time:
        inside = tree.step >= 0
        units = float(len(np.unique(np.asarray(steps.index))))
    else:
        inside = np.ones(len(tree), dtype=bool)
        units = _wall_seconds(tree)
    if len(steps):
        inside[np.asarray(steps.node)] = False
    inside &= ~np.isin(tree.layer, list(_NOT_OPERATORS))
    nodes = np.flatnonzero(inside)
    keys = tree.layer[nodes].astype(np.int64) * (len(tree.names) + 1) + tree.name[nodes]
    unique, inverse = np.unique(keys, return_inverse=True)
    self_ns = np.bincount(inverse, weights=tree.self_ns[nodes], minlength=len(unique))
    calls = np.bincount(inverse, minlength=len(unique))
    totals = {}
    for k, key in enumerate(unique.tolist()):
        layer, name = divmod(key, len(tree.names) + 1)
        totals[(layer, tree.names[name])] = (int(self_ns[k]), int(calls[k]))
    return totals, max(units, 1e-9)


OPERATOR_COLUMNS = (
    "layer",
    "name",
    "a_calls_per_unit",
    "b_calls_per_unit",
    "a_self_ns_per_unit",
    "b_self_ns_per_unit",
    "a_self_ns_per_call",
    "b_self_ns_per_call",
    "delta_self_ns_per_unit",
    "share_of_step_change",
)


def operator_table(
    a: CallTree, b: CallTree, step_change_ns: float, wall_time: bool = False
) -> pa.Table:
    """One row per operator (layer, name) on either side, per unit, largest increase first.

    The unit is an iteration (`RunDiff.unit`), or a second of wall time when `wall_time` (the two
    runs count different units). `share_of_step_change` is the operator's change in self time per
    iteration over the change in mean iteration time (NaN when that change is NaN: unchanged within
    noise, or no steps): near 1 means this operator alone accounts for the slowdown. Self time on
    GPU streams runs beside the host, so GPU shares can exceed 1 or sum past it; they say where
    time went, not a partition of the step.
    """
    a_totals, a_units = _operator_totals(a, wall_time)
    b_totals, b_units = _operator_totals(b, wall_time)
    keys = sorted(set(a_totals) | set(b_totals), key=lambda k: (k[0], k[1]))
    rows: dict[str, list] = {c: [] for c in OPERATOR_COLUMNS}
    shares_step_change = np.isfinite(step_change_ns) and step_change_ns and not wall_time
    for key in keys:
        a_self, a_calls = a_totals.get(key, (0, 0))
        b_self, b_calls = b_totals.get(key, (0, 0))
        a_per_unit, b_per_unit = a_self / a_units, b_self / b_units
        delta = b_per_unit - a_per_unit
        rows["layer"].append(LAYERS[key[0]])
        rows["name"].append(key[1])
        rows["a_calls_per_unit"].append(a_calls / a_units)
        rows["b_calls_per_unit"].append(b_calls / b_units)
        rows["a_self_ns_per_unit"].append(a_per_unit)
        rows["b_self_ns_per_unit"].append(b_per_unit)
        rows["a_self_ns_per_call"].append(a_self / a_calls if a_calls else float("nan"))
        rows["b_self_ns_per_call"].append(b_self / b_calls if b_calls else float("nan"))
        rows["delta_self_ns_per_unit"].append(delta)
        rows["share_of_step_change"].append(
            delta / step_change_ns if shares_step_change else np.nan
        )
    table = pa.table(
        {
            c: pa.array(v, type=pa.string() if c in ("layer", "name") else pa.float64())
            for c, v in rows.items()
        }
    )
    order = np.argsort(-np.asarray(rows["delta_self_ns_per_unit"], dtype=float), kind="stable")
    return table.take(pa.array(order, type=pa.int64()))


def _explaining(operators: pa.Table) -> list[str]:
    """The operators whose self time per unit grew most (those that only shrank explain no rise)."""
    names = operators.column("name").to_pylist()
    deltas = operators.column("delta_self_ns_per_unit").to_pylist()
    return [n for n, d in zip(names, deltas, strict=True) if d > 0][:EXPLAINING_OPERATORS]


def _summary(diff: RunDiff) -> str:
    lines = []
    for k in diff.kinds:
        if not (k.a_steps and k.b_steps):
            only = "A" if k.a_steps else "B"
            count = k.a_steps or k.b_steps
            lines.append(f"{k.kind}: only in {only} ({count} step{'s' if count > 1 else ''})")
            continue
        lines.append(
            f"{k.kind}: median {format_ns(k.a_median_ns)} → {format_ns(k.b_median_ns)}, "
            f"p90 {format_ns(k.a_p90_ns)} → {format_ns(k.b_p90_ns)}; "
            f"{k.metric} {k.change_pct:+.1f}% ({k.a_steps} vs {k.b_steps} steps)"
        )
    unit = diff.unit
    if diff.explaining:
        named = diff.operators.slice(0, len(diff.explaining)).to_pylist()
        labels = distinct_short_names([row["name"] for row in named], 80)
        parts = []
        for row, label in zip(named, labels, strict=True):
            share = row["share_of_step_change"]
            share_text = f", {share:.0%} of the step-time change" if np.isfinite(share) else ""
            new = " (new in B)" if row["a_calls_per_unit"] == 0 else ""
            parts.append(
                f"{label} ({row['layer']}){new} "
                f"{signed_ns(row['delta_self_ns_per_unit'])} per {unit}{share_text}"
            )
        steps_known = np.isfinite(diff.a_step_ns) and np.isfinite(diff.b_step_ns)
        if steps_known and not np.isfinite(named[0]["share_of_step_change"]):
            lines.append(
                f"mean step time {format_ns(diff.a_step_ns)} → {format_ns(diff.b_step_ns)}: "
                f"unchanged within {STEP_CHANGE_FLOOR:.1%}"
            )
        lines.append("largest increases: " + "; ".join(parts))
    else:
        lines.append(f"no operator takes more self time per {unit} in B than in A")
    return "\n".join(lines)


def signed_ns(value: float) -> str:
    return ("+" if value >= 0 else "−") + format_ns(abs(value))


def distinct_short_names(names: Sequence[str], width: int = NAME_WIDTH) -> list[str]:
    """`short_name` of each, except that names whose short forms collide keep their head and
    their tail around a '…' (where they differ: a template argument, a source line), or are
    shown whole where even that collides.

    Two kernels that differ only in their template arguments would otherwise read the same.
    """
    short = [short_name(n, width) for n in names]
    owners: dict[str, set[str]] = {}
    for name, text in zip(names, short, strict=True):
        owners.setdefault(text, set()).add(name)
    middle = {
        name: _head_and_tail(name.removeprefix("void "), width)
        for group in owners.values()
        if len(group) > 1
        for name in group
    }
    middle_owners: dict[str, set[str]] = {}
    for name, text in middle.items():
        middle_owners.setdefault(text, set()).add(name)
    shown = []
    for name, text in zip(names, short, strict=True):
        if len(owners[text]) == 1:
            shown.append(text)
        elif len(middle_owners[middle[name]]) == 1:
            shown.append(middle[name])
        else:
            shown.append(name.removeprefix("void "))
    return shown


def _head_and_tail(name: str, width: int) -> str:
    """The first third and the last two thirds of `width` characters of `name`, joined by '…'."""
    if len(name) <= width:
        return name
    head = max(1, (width - 1) // 3)
    return name[:head] + "…" + name[len(name) - (width - 1 - head) :]


def changed_operators(diff: RunDiff, top: int = 10) -> list[dict]:
    """The operators whose self time per unit changed most, in either direction."""
    rows = diff.operators.to_pylist()
    return sorted(
        (r for r in rows if r["delta_self_ns_per_unit"] != 0),
        key=lambda r: -abs(r["delta_self_ns_per_unit"]),
    )[:top]


def render_diff_terminal(diff: RunDiff, top: int = 10, look: Look = PLAIN) -> str:
    """The summary, then the operators that changed most in either direction, as a table."""
    lines = wrapped("A: ", ", ".join(diff.a_inputs), look)
    lines.extend(wrapped("B: ", ", ".join(diff.b_inputs), look))
    lines.append("")
    for line in diff.summary.splitlines():
        lines.extend(wrapped("", line, look))
    lines.append("")
    unit = _unit_abbreviation(diff.unit)
    rows = changed_operators(diff, top)
    header = [f"Δ self/{unit}", f"A calls/{unit}", f"B calls/{unit}", "A /call", "B /call"]
    # the numbers take their columns; the name is shortened to what is left, where it can be
    room = look.width - sum(len(h) + COLUMN_GAP for h in header) - len(" (runtime)")
    labels = distinct_short_names([row["name"] for row in rows], max(MIN_NAME_WIDTH, room))
    table = [
        [
            signed_ns(row["delta_self_ns_per_unit"]),
            calls_text(row["a_calls_per_unit"]),
            calls_text(row["b_calls_per_unit"]),
            per_call_text(row["a_self_ns_per_call"]),
            per_call_text(row["b_self_ns_per_call"]),
            f"{label} ({row['layer']})",
        ]
        for row, label in zip(rows, labels, strict=True)
    ]
    lines.extend(table_lines([*header, "operator"], table, look, indent=0, right=range(5)))
    for note in diff.notes:
        lines.extend(wrapped("note: ", note, look))
    for problem in diff.not_comparable:
        lines.extend(wrapped("not comparable: ", problem, look))
    return "\n".join(lines)


def diff_verdict(diff: RunDiff, gate_pct: float | None = None) -> tuple[str, str]:
    """(state, detail): "not comparable", "regression" or "no regression", and what it rests on,
    as the gate (`--fail-on-regression`, whose exit code it matches) would judge."""
    if diff.not_comparable:
        return "not comparable", "; ".join(diff.not_comparable)
    if gate_pct is not None and diff.regressions(gate_pct):
        kinds = ", ".join(f"{k.kind} {k.change_pct:+.1f}%" for k in diff.regressions(gate_pct))
        return "regression", f"beyond {gate_pct:g}%: {kinds}"
    return "no regression", f"beyond {gate_pct:g}%" if gate_pct is not None else ""


def render_diff_markdown(diff: RunDiff, top: int = 10, gate_pct: float | None = None) -> str:
    """GitHub-flavoured markdown for a pull-request comment: verdict line, kinds, operators."""
    state, detail = diff_verdict(diff, gate_pct)
    joint = ": " if diff.not_comparable else " "
    headline = f"**{state}**" + (joint + _md(detail) if detail else "")
    lines = [f"### teller diff: {headline}", ""]
    lines.append(f"A: {_md(', '.join(diff.a_inputs))}  ")
    lines.append(f"B: {_md(', '.join(diff.b_inputs))}")
    lines.append("")
    if diff.kinds:
        lines.append(
            "| step kind | steps A | steps B | median A | median B | p90 A | p90 B | change |"
        )
        lines.append("|---|--:|--:|--:|--:|--:|--:|--:|")
        for k in diff.kinds:
            change = f"{k.change_pct:+.1f}% ({k.metric})" if np.isfinite(k.change_pct) else "—"
            medians = [
                format_ns(v) if n else "—"
                for v, n in ((k.a_median_ns, k.a_steps), (k.b_median_ns, k.b_steps))
            ]
            p90s = [
                format_ns(v) if n else "—"
                for v, n in ((k.a_p90_ns, k.a_steps), (k.b_p90_ns, k.b_steps))
            ]
            lines.append(
                f"| {_md(k.kind)} | {k.a_steps} | {k.b_steps} | {medians[0]} | {medians[1]} "
                f"| {p90s[0]} | {p90s[1]} | {change} |"
            )
        lines.append("")
    rows = changed_operators(diff, top)
    if rows:
        unit = _unit_abbreviation(diff.unit)
        lines.append(
            f"| Δ self/{unit} | calls/{unit} A | calls/{unit} B | A /call | B /call | operator |"
        )
        lines.append("|--:|--:|--:|--:|--:|---|")
        labels = distinct_short_names([row["name"] for row in rows])
        for row, label in zip(rows, labels, strict=True):
            lines.append(
                f"| {signed_ns(row['delta_self_ns_per_unit'])} "
                f"| {calls_text(row['a_calls_per_unit'])} | {calls_text(row['b_calls_per_unit'])} "
                f"| {per_call_text(row['a_self_ns_per_call'])} | {per_call_text(row['b_self_ns_per_call'])} "
                f"| {_md(label)} ({row['layer']}) |"
            )
        lines.append("")
    lines.extend(f"> note: {_md(note)}" for note in diff.notes)
    return "\n".join(lines).rstrip() + "\n"


def _md(text: str) -> str:
    """Text safe inside a markdown table cell: pipes, HTML and emphasis characters escaped."""
    for char in ("\\", "|", "*", "_", "`", "[", "]", "<", ">"):
        text = text.replace(char, "\\" + char)
    return text.replace("\n", " ")


def _unit_abbreviation(unit: str) -> str:
    return {UNIT_STEP: "step", UNIT_ITERATION: "iter", UNIT_WALL_SECOND: "s"}[unit]


def calls_text(value: float) -> str:
    return f"{value:.3g}" if value else "0"


def per_call_text(value: float) -> str:
    return format_ns(value) if np.isfinite(value) else "—"
