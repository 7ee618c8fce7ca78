"""`teller diff`: two runs compared step kind by step kind and operator by operator.

A person who changed a kernel, a driver or a config wants to know three things: did steps get
slower, which kind of step (prefill, decode, mixed), and which operators account for it. Runs rarely
batch the same requests, so step times are also compared per batched token when the batch
composition differs; operators are compared per step (self time and calls), so two runs of
different lengths still line up. The result is plain data (dataclasses and an Arrow table) that the
terminal and JSON renderers, and CI through `--fail-on-regression`, all read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from teller.callchain.render import format_ns, short_name
from teller.ingest.schema import LAYER_CODE, LAYERS

if TYPE_CHECKING:
    from teller.callchain.tree import CallTree

DIFF_SCHEMA_VERSION = "teller.diff/1"

#: Median tokens per step may differ by this share before steps are compared per token instead.
COMPOSITION_TOLERANCE = 0.10
#: A change in mean iteration time smaller than this share of A's is noise: no operator shares.
STEP_CHANGE_FLOOR = 0.005
#: Operators named in the verdict as explaining the difference.
EXPLAINING_OPERATORS = 3
#: Layers left out of the operator comparison: requests span many steps; steps are the unit itself.
_NOT_OPERATORS = frozenset({LAYER_CODE["request"]})


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
    kinds: list[KindDiff]
    operators: pa.Table  # one row per (layer, operator name); see `operator_table`
    a_step_ns: float  # mean iteration time over all steps (the change operators are shared out of)
    b_step_ns: float
    explaining: list[str]  # operator names, largest increase in self time per step first
    summary: str
    schema: str = DIFF_SCHEMA_VERSION
    notes: list[str] = field(default_factory=list)

    def regressions(self, threshold_pct: float) -> list[KindDiff]:
        return [k for k in self.kinds if k.regressed(threshold_pct)]

    def to_json(self, top_operators: int = 50) -> dict:
        document = asdict(self)
        document["operators"] = self.operators.slice(0, top_operators).to_pylist()
        for kind in document["kinds"]:  # JSON has no NaN: absent numbers are null
            for key, value in kind.items():
                if isinstance(value, float) and not np.isfinite(value):
                    kind[key] = None
        for row in document["operators"]:
            for key, value in row.items():
                if isinstance(value, float) and not np.isfinite(value):
                    row[key] = None
        return document


def compare(a: CallTree, b: CallTree, a_inputs: list[str], b_inputs: list[str]) -> RunDiff:
    """Compare run B's tree against run A's (A is the reference); the inputs name their files."""
    a_iter, b_iter = _iterations(a), _iterations(b)
    kinds = [_kind_diff(kind, a_iter, b_iter) for kind in _kinds(a_iter, b_iter)]
    a_step_ns = float(a_iter["dur_ns"].mean()) if len(a_iter["dur_ns"]) else float("nan")
    b_step_ns = float(b_iter["dur_ns"].mean()) if len(b_iter["dur_ns"]) else float("nan")
    step_change_ns = b_step_ns - a_step_ns
    if not abs(step_change_ns) > STEP_CHANGE_FLOOR * a_step_ns:
        step_change_ns = float("nan")  # unchanged (or unknown): shares of it would be noise
    operators = operator_table(a, b, step_change_ns)
    explaining = _explaining(operators)
    notes = []
    if not len(a_iter["dur_ns"]) or not len(b_iter["dur_ns"]):
        notes.append("a run has no step annotations: operators are compared over the whole run")
    diff = RunDiff(
        a_inputs=a_inputs,
        b_inputs=b_inputs,
        kinds=kinds,
        operators=operators,
        a_step_ns=a_step_ns,
        b_step_ns=b_step_ns,
        explaining=explaining,
        summary="",
        notes=notes,
    )
    diff.summary = _summary(diff)
    return diff


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


def _operator_totals(tree: CallTree) -> tuple[dict[tuple[int, str], tuple[int, int]], int]:
    """Self time and calls per (layer, name) over the nodes inside steps; and the step count.

    The step annotation nodes themselves are left out (their names carry the batch, so no two
    match); a run without steps is compared over all its nodes, as one step.
    """
    steps = tree.steps
    if len(steps):
        inside = tree.step >= 0
        inside[np.asarray(steps.node)] = False
        iterations = len(np.unique(np.asarray(steps.index)))
    else:
        inside = np.ones(len(tree), dtype=bool)
        iterations = 1
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
    return totals, max(iterations, 1)


def operator_table(a: CallTree, b: CallTree, step_change_ns: float) -> pa.Table:
    """One row per operator (layer, name) on either side, per step, largest increase first.

    `share_of_step_change` is the operator's change in self time per step over the change in mean
    iteration time (NaN when that change is NaN: unchanged within noise): near 1 means this operator alone accounts for the slowdown. Self time on GPU
    streams runs beside the host, so GPU shares can exceed 1 or sum past it; they say where time
    went, not a partition of the step.
    """
    a_totals, a_steps = _operator_totals(a)
    b_totals, b_steps = _operator_totals(b)
    keys = sorted(set(a_totals) | set(b_totals), key=lambda k: (k[0], k[1]))
    rows: dict[str, list] = {
        c: []
        for c in (
            "layer",
            "name",
            "a_calls_per_step",
            "b_calls_per_step",
            "a_self_ns_per_step",
            "b_self_ns_per_step",
            "a_self_ns_per_call",
            "b_self_ns_per_call",
            "delta_self_ns_per_step",
            "share_of_step_change",
        )
    }
    for key in keys:
        a_self, a_calls = a_totals.get(key, (0, 0))
        b_self, b_calls = b_totals.get(key, (0, 0))
        a_per_step, b_per_step = a_self / a_steps, b_self / b_steps
        delta = b_per_step - a_per_step
        rows["layer"].append(LAYERS[key[0]])
        rows["name"].append(key[1])
        rows["a_calls_per_step"].append(a_calls / a_steps)
        rows["b_calls_per_step"].append(b_calls / b_steps)
        rows["a_self_ns_per_step"].append(a_per_step)
        rows["b_self_ns_per_step"].append(b_per_step)
        rows["a_self_ns_per_call"].append(a_self / a_calls if a_calls else float("nan"))
        rows["b_self_ns_per_call"].append(b_self / b_calls if b_calls else float("nan"))
        rows["delta_self_ns_per_step"].append(delta)
        rows["share_of_step_change"].append(
            delta / step_change_ns if np.isfinite(step_change_ns) and step_change_ns else np.nan
        )
    table = pa.table(rows)
    order = np.argsort(-np.asarray(rows["delta_self_ns_per_step"], dtype=float), kind="stable")
    return table.take(pa.array(order, type=pa.int64()))


def _explaining(operators: pa.Table) -> list[str]:
    """The operators whose self time per step grew most (those that only shrank explain no rise)."""
    names = operators.column("name").to_pylist()
    deltas = operators.column("delta_self_ns_per_step").to_pylist()
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
    if diff.explaining:
        named = diff.operators.slice(0, len(diff.explaining)).to_pylist()
        parts = []
        for row in named:
            share = row["share_of_step_change"]
            share_text = f", {share:.0%} of the step-time change" if np.isfinite(share) else ""
            new = " (new in B)" if row["a_calls_per_step"] == 0 else ""
            parts.append(
                f"{short_name(row['name'], 80)} ({row['layer']}){new} "
                f"{_signed_ns(row['delta_self_ns_per_step'])} per step{share_text}"
            )
        if not np.isfinite(diff.operators.column("share_of_step_change")[0].as_py()):
            lines.append(
                f"mean step time {format_ns(diff.a_step_ns)} → {format_ns(diff.b_step_ns)}: "
                f"unchanged within {STEP_CHANGE_FLOOR:.1%}"
            )
        lines.append("largest increases: " + "; ".join(parts))
    else:
        lines.append("no operator takes more self time per step in B than in A")
    return "\n".join(lines)


def _signed_ns(value: float) -> str:
    return ("+" if value >= 0 else "−") + format_ns(abs(value))


def render_diff_terminal(diff: RunDiff, top: int = 10) -> str:
    """The summary, then the operators that changed most in either direction."""
    lines = [f"A: {', '.join(diff.a_inputs)}", f"B: {', '.join(diff.b_inputs)}", ""]
    lines.extend(diff.summary.splitlines())
    lines.append("")
    lines.append(f"{'Δ self/step':>12}  {'A /call':>10}  {'B /call':>10}  operator")
    rows = diff.operators.to_pylist()
    changed = sorted(
        (r for r in rows if r["delta_self_ns_per_step"] != 0),
        key=lambda r: -abs(r["delta_self_ns_per_step"]),
    )[:top]
    for row in changed:
        lines.append(
            f"{_signed_ns(row['delta_self_ns_per_step']):>12}  "
            f"{_per_call(row['a_self_ns_per_call']):>10}  {_per_call(row['b_self_ns_per_call']):>10}"
            f"  {short_name(row['name'], 70)} ({row['layer']})"
        )
    lines.extend(f"note: {note}" for note in diff.notes)
    return "\n".join(lines)


def _per_call(value: float) -> str:
    return format_ns(value) if np.isfinite(value) else "—"
