"""Cases → training examples: one example per step (iteration) of one case, all ranks.

Reading a case is the slow part (trees of 10⁵ nodes), so it happens once, into `StepRecord`s that
keep only what an example needs: the step's numeric features, the localizer's top candidates with
the ancestor path of each (a small `Slice`, so the TPE vocabulary can be trained on them and any
vocabulary can encode them later), the step's aligned log lines, and the labels. `encode` turns
records into padded arrays for a given vocabulary; `raw=True` encodes every node as its own token
(the "no TPE" ablation).

Bounded sequences: the localizer (run with thresholds low enough to over-propose) narrows a step
of 10⁴–10⁵ nodes to `MAX_CANDIDATES` candidate nodes; each brings at most `PATH_TOKENS` tokens of
context (the deepest ones of its ancestor path).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from teller.callchain.facts import Arrivals, RunFacts, kernel_sequences
from teller.callchain.tree import CallTree
from teller.labels import CaseLabels, equivalent_operators
from teller.layout import CaseDir
from teller.localize import (
    NumericLocalizer,
    OperatorCandidate,
    StepScore,
    keep_top,
    transfer_residuals,
)
from teller.rca.model import (
    CANDIDATE_KINDS,
    FAULT_NAMES,
    LOG_FLOATS,
    ROLE_CONTEXT,
    ROLE_FOCUS,
    STEP_FLOATS,
    TOKEN_FLOATS,
    log_bucket,
    safe_log_ratio,
)
from teller.rca.words import MAX_WORDS, WordVocab, target_words
from teller.slices.cut import slice_of_nodes
from teller.slices.slice import Slice
from teller.tpe.tokenizer import TPE

MAX_CANDIDATES = 8
PATH_TOKENS = 6
MAX_TRACE_TOKENS = MAX_CANDIDATES * PATH_TOKENS
MAX_LOG_LINES = 8
#: Which steps count as not normal when operators are measured against the normal steps: far
#: below the localizer's own thresholds (5σ, 15%), so borderline steps are not anyone's reference.
#: Every step gets its ranked candidates all the same (`candidate_z=-inf`): a delayed link or a
#: swapped kernel slows a step by less than its batch's spread, yet its collective or its new
#: kernel stands out among the step's operators, and the model, not a threshold, decides.
PROPOSE_Z = 3.0
PROPOSE_RATIO = 1.03
STEP_KINDS = ("prefill", "decode", "mixed")

#: Localizer candidate kinds the model reads as one of its own: an idle-GPU candidate is host
#: work that delayed the GPU, i.e. compute on the host; a persistent shift is compute that regressed.
_KIND_AS = {"idle": "compute", "shift": "compute", "forward": "compute"}
#: PyTorch profiler's name prefix of module scopes (with_modules / with_stack traces).
_MODULE_PREFIX = "nn.Module: "


@dataclass
class StepRecord:
    """Everything one example needs, cut out of a case once."""

    case_id: str
    iteration: int
    step_float: np.ndarray  # STEP_FLOATS
    candidates: list[OperatorCandidate]
    paths: list[Slice]  # ancestor path of each candidate's node, the node last
    log_template: np.ndarray  # int, hashed template buckets (0 = none)
    log_float: np.ndarray  # (lines, LOG_FLOATS)
    log_lines: list[str]
    queue: np.ndarray | None  # (LOG_FLOATS,) the request queue at the step, from the logs
    localizer_anomalous: bool
    expected_ns: int
    dur_ns: int
    # labels (None/False without a labels.json)
    anomalous: bool = False
    fault: str = "none"
    target: int = -1  # index into candidates of the guilty one, -1 unknown/none
    words: list[str] = field(default_factory=list)  # the reference explanation, slotted
    meta: dict = field(default_factory=dict)


def case_records(
    tree: CallTree,
    case_id: str,
    labels: CaseLabels | None = None,
    log_paths: Sequence[Path] = (),
    facts: RunFacts | None = None,
) -> list[StepRecord]:
    """One record per iteration of the tree; `facts`: the tree's `RunFacts` where the caller has
    them (computed here otherwise)."""
    facts = RunFacts.of(tree, facts)
    localization = NumericLocalizer(
        step_z=PROPOSE_Z, min_ratio=PROPOSE_RATIO, top_k=MAX_CANDIDATES, candidate_z=-np.inf
    ).score(tree, facts)
    work = _work_features(tree, facts)
    slowdown = _kernel_slowdown_shape(tree)
    transfers = transfer_residuals(tree, facts)
    collectives = _last_arrivals(facts.arrivals)
    forwards = _forward_nodes(tree)
    logs, queues = _aligned_logs(tree, log_paths)
    strict = NumericLocalizer()
    records = []
    truth = set(labels.steps) if labels is not None and labels.is_fault else set()
    for score in localization.steps:
        if score.kind == "unfinished":  # a hang's step: no step node to encode (the localizer's)
            continue
        steps = tree.steps
        row = int(np.flatnonzero(steps.index == score.iteration)[0])
        kind = steps.kind[row]
        step_float = np.zeros(STEP_FLOATS, dtype=np.float32)
        step_float[0] = np.clip(score.z / 10.0, -2.0, 5.0)
        step_float[1] = safe_log_ratio(score.dur_ns, score.expected_ns)
        step_float[2] = np.log1p(max(int(steps.context_tokens[row]), 0)) / 8.0
        step_float[3] = np.log1p(max(int(steps.generation_tokens[row]), 0)) / 8.0
        if kind in STEP_KINDS:
            step_float[4 + STEP_KINDS.index(kind)] = 1.0
        step_float[7] = float(
            score.z >= strict.step_z and score.dur_ns >= strict.min_ratio * score.expected_ns
        )
        step_float[8:14] = work[score.iteration]
        # a persistent operator shift (one rank's operator slower than its peers' step after step)
        shift_ns = localization.shifted.get(score.iteration, 0.0)
        step_float[14] = float(shift_ns > 0)
        step_float[15] = np.log1p(shift_ns / 1e5) / 4.0
        shape = slowdown.get(score.iteration, np.zeros(5, np.float32))
        step_float[32:36], step_float[42] = shape[:4], shape[4]
        # the step's collectives' transfer time against the run's fit for its batch (a slower or
        # longer link: microseconds in a step of milliseconds, but steady)
        log_ratio, transfer_z = transfers.get(score.iteration, (0.0, 0.0))
        step_float[38] = np.clip(log_ratio, -1.0, 3.0)
        step_float[39] = np.clip(transfer_z / 10.0, -2.0, 5.0)
        candidates = localization.candidates.get(score.iteration, [])
        extras = [
            _collective_candidate(tree, collectives, transfers, score, candidates),
            _forward_candidate(tree, forwards, score, candidates),
        ]
        extras = [c for c in extras if c is not None]
        if extras:
            candidates = [*keep_top(candidates, MAX_CANDIDATES - len(extras)), *extras]
        templates, floats, lines = logs.get(
            score.iteration,
            (np.zeros(0, np.int64), np.zeros((0, LOG_FLOATS), np.float32), []),
        )
        record = StepRecord(
            case_id=case_id,
            iteration=score.iteration,
            step_float=step_float,
            candidates=candidates,
            paths=[slice_of_nodes(tree, [c.node]) for c in candidates],
            log_template=templates,
            log_float=floats,
            log_lines=lines,
            queue=queues.get(score.iteration),
            localizer_anomalous=bool(step_float[7]),
            expected_ns=score.expected_ns,
            dur_ns=score.dur_ns,
        )
        if labels is not None:
            record.anomalous = score.iteration in truth
            record.fault = labels.fault if record.anomalous else "none"
            record.target = _target(candidates, labels) if record.anomalous else -1
            if record.anomalous:
                record.words = target_words(
                    labels.explanation,
                    labels.guilty_operator,
                    labels.guilty_rank,
                    has_node=record.target >= 0,
                )
        records.append(record)
    _add_context(records)
    return records


#: Per-step features a neighbour lends (z, time against expected, strict flag, operator shift).
_NEIGHBOUR_FEATURES = [0, 1, 7, 14]
#: Temporal work ratios (GPU, host, comm: the largest rank against its own median) and GPU imbalance.
_WORK_PEAKS = [9, 11, 13, 8]


def _add_context(records: list[StepRecord]) -> None:
    """Features 16–31: the previous and next steps' features and the whole run's shape; 36–37:
    the step's batch against the run's usual one; 40–41: the previous and next steps' transfer z.

    Why: a fault lasts a window of steps, so a borderline step between two slow ones is more likely
    part of it (the slice's time order, T); and fault types differ in how a run degrades rather
    than in any one step (a power cap slows every step of its window alike, a co-tenant
    erratically; a contended host shows in host time, a link in collectives), which one step
    cannot show."""
    if not records:
        return
    records = sorted(records, key=lambda r: r.iteration)
    table = np.stack([r.step_float[:16] for r in records])
    strict = table[:, 7] > 0
    ratio = table[:, 1]
    flagged = ratio[strict] if strict.any() else ratio[:0]
    run = np.array(
        [
            strict.mean(),
            table[:, 0].max(),
            flagged.mean() if len(flagged) else 0.0,
            flagged.std() if len(flagged) > 1 else 0.0,
            *table[:, _WORK_PEAKS].max(axis=0),
        ],
        dtype=np.float32,
    )
    # the batch against the run's usual batch of the same step kind (log ratios; features 2–3
    # hold log1p(tokens) / 8): a misconfigured scheduler shrinks batches while requests queue
    kind = table[:, 4:7].argmax(axis=1) + 3 * (table[:, 4:7].max(axis=1) == 0)
    batch = np.clip(8.0 * _against_same_kind(table[:, 2:4], kind), -4, 4)
    for i, record in enumerate(records):
        record.step_float[36:38] = batch[i]
        if i > 0:
            record.step_float[16:20] = table[i - 1, _NEIGHBOUR_FEATURES]
            record.step_float[40] = records[i - 1].step_float[39]
        if i + 1 < len(records):
            record.step_float[20:24] = table[i + 1, _NEIGHBOUR_FEATURES]
            record.step_float[41] = records[i + 1].step_float[39]
        record.step_float[24:32] = run


def _forward_nodes(tree: CallTree) -> dict[int, dict[int, int]]:
    """iteration → rank → the step's outermost module scope on that rank (the model's forward),
    where the trace records module scopes."""
    modules = [i for i, name in enumerate(tree.names) if name.startswith(_MODULE_PREFIX)]
    if not modules:
        return {}
    rows = np.flatnonzero(np.isin(tree.name, modules) & (tree.step >= 0))
    rows = rows[np.lexsort((-tree.dur[rows], tree.depth[rows]))]  # shallowest, then longest
    out: dict[int, dict[int, int]] = {}
    for i in rows.tolist():
        out.setdefault(int(tree.steps.index[tree.step[i]]), {}).setdefault(int(tree.rank[i]), i)
    return out


def _last_arrivals(arrivals: Arrivals | None) -> dict[int, tuple[int, int, int]]:
    """iteration → (rank, node, own ns): the rank whose collectives, where it arrived last, took
    longest in all (their time is transfer alone), and the longest of those collectives."""
    if arrivals is None:
        return {}
    iteration_of, rank, own_ns, node = (
        arrivals.iteration,
        arrivals.rank,
        arrivals.own_ns,
        arrivals.node,
    )
    rows = np.flatnonzero(arrivals.is_last)
    out: dict[int, tuple[int, int, int]] = {}
    totals: dict[tuple[int, int], float] = {}
    longest: dict[tuple[int, int], int] = {}
    for i in rows.tolist():
        key = (int(iteration_of[i]), int(rank[i]))
        totals[key] = totals.get(key, 0.0) + float(own_ns[i])
        if key not in longest or own_ns[i] > own_ns[longest[key]]:
            longest[key] = i
    for (iteration, r), total in totals.items():
        if iteration not in out or total > out[iteration][2]:
            out[iteration] = (r, int(node[longest[(iteration, r)]]), int(total))
    return out


def _collective_candidate(
    tree: CallTree,
    collectives: dict[int, tuple[int, int, int]],
    transfers: dict[int, tuple[float, float]],
    score: StepScore,
    candidates: list[OperatorCandidate],
) -> OperatorCandidate | None:
    """The step's transfer as one more candidate: the collective of the rank that spent longest
    in collectives it arrived last at, measured against the run's transfer fit for the batch.

    Why: a contended or throttled link adds microseconds per collective on every rank alike, so
    no collective's excess over its nearest normal steps clears the localizer's noise floor, and
    in half of the link-fault training steps (39 of 80) no candidate was the guilty collective:
    the pointer had nothing right to point at. The step's transfer residual (features 38–39)
    says how far off the transfer is; this gives that number a node. Skipped when the localizer
    already proposes that node."""
    found = collectives.get(score.iteration)
    if found is None:
        return None
    rank, node, observed = found
    if any(c.node == node for c in candidates):
        return None
    log_ratio, z = transfers.get(score.iteration, (0.0, 0.0))
    normal = int(observed / np.exp(log_ratio))
    reference = "the step's transfer time vs the run's fit for its batch"
    return _node_candidate(tree, score, rank, node, observed, normal, z, reference, "transfer")


def _forward_candidate(
    tree: CallTree,
    forwards: dict[int, dict[int, int]],
    score: StepScore,
    candidates: list[OperatorCandidate],
) -> OperatorCandidate | None:
    """The whole forward pass as one more candidate, ranked last.

    Why: some faults slow every operator of a step alike (a shrunken KV cache recomputes
    preempted prefills; the forward grows, no operator stands out), and their guilty node is
    the model's forward itself; the localizer only proposes single operators. The rank is the
    top candidate's (tensor-parallel ranks run the same forward), else the lowest."""
    by_rank = forwards.get(score.iteration)
    if not by_rank:
        return None
    rank = candidates[0].rank if candidates and candidates[0].rank in by_rank else min(by_rank)
    node = by_rank[rank]
    observed = int(tree.dur[node])
    normal = int(observed * score.expected_ns / max(score.dur_ns, 1))
    reference = "the step's expected time for its batch"
    return _node_candidate(tree, score, rank, node, observed, normal, score.z, reference, "forward")


def _node_candidate(
    tree: CallTree,
    score: StepScore,
    rank: int,
    node: int,
    observed_ns: int,
    normal_ns: int,
    z: float,
    reference: str,
    kind: str,
) -> OperatorCandidate:
    """A candidate the records add beside the localizer's (ranked after them, score 0)."""
    return OperatorCandidate(
        iteration=score.iteration,
        rank=rank,
        operator=tree.names[tree.name[node]],
        score=0.0,
        observed_ns=observed_ns,
        normal_ns=normal_ns,
        z=z,
        node=node,
        reference=reference,
        kind=kind,
    )


def _target(candidates: list[OperatorCandidate], labels: CaseLabels) -> int:
    """The candidate the labels blame: same operator and rank, else same operator, else (for
    faults without an operator) the first candidate on the guilty rank."""
    op, rank = labels.guilty_operator, labels.guilty_rank
    names = equivalent_operators(labels)  # a launch delayed by a busy host: either launch call
    rules = []
    if op is not None:
        rules += [lambda c: c.operator in names and c.rank == rank, lambda c: c.operator in names]
    elif rank is not None:
        rules.append(lambda c: c.rank == rank)
    for rule in rules:
        for i, candidate in enumerate(candidates):
            if rule(candidate):
                return i
    return -1


def _work_features(tree: CallTree, facts: RunFacts) -> dict[int, np.ndarray]:
    """Per iteration, for GPU, host and comm work: the largest rank's share against the median
    rank (imbalance) and against its own median over the case's steps of the same kind
    (temporal), as log ratios.

    Why the same kind: a prefill's collectives move hundreds of times a decode's bytes, so against
    the whole run's median a decode step's comm looks small even when every message of it waits
    an extra network hop (a delayed or contended link)."""
    steps = tree.steps
    # host work with the calls that mostly wait left in (`host_ns`), unlike the localizer's: the
    # shipped model's weights were learned on this measure
    measures = [facts.work.gpu_ns, facts.work.host_ns, facts.work.comm_ns]
    iterations, row = np.unique(steps.index, return_inverse=True)
    ranks, column = np.unique(steps.rank, return_inverse=True)
    kind_of = np.zeros(len(iterations), dtype=object)
    kind_of[row] = np.asarray(steps.kind, dtype=object)
    out = np.zeros((len(iterations), 2 * len(measures)), dtype=np.float32)
    for m, measure in enumerate(measures):
        grid = np.full((len(iterations), len(ranks)), np.nan)
        grid[row, column] = measure
        logs = np.log(np.maximum(np.nan_to_num(grid, nan=1.0), 1.0))
        imbalance = logs - np.median(logs, axis=1, keepdims=True)
        out[:, 2 * m] = np.clip(imbalance.max(axis=1), -3, 3)
        out[:, 2 * m + 1] = np.clip(_against_same_kind(logs, kind_of).max(axis=1), -3, 3)
    return {int(it): out[i] for i, it in enumerate(iterations.tolist())}


def _against_same_kind(logs: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """(steps × columns) log measures minus each column's median over the steps of the row's
    kind (per-rank work over time; the batch against the run's usual one)."""
    out = np.zeros_like(logs)
    for kind in set(kinds.tolist()):
        same = kinds == kind
        out[same] = logs[same] - np.median(logs[same], axis=0, keepdims=True)
    return out


def _kernel_slowdown_shape(tree: CallTree) -> dict[int, np.ndarray]:
    """Per iteration, how the slowest rank's compute kernels are slower than its peers' same
    kernels: median, spread and 90th percentile of the per-kernel log ratios against the median
    rank (with two ranks, half their difference), the share of kernels more than 10% slower, and
    the ratios' scatter against the run's (log of the step's median absolute deviation over the
    run's median of it, /2).

    Why: the ranks of a tensor-parallel group launch the same kernels in the same order, so kernel
    i of one rank compares with kernel i of the others. A power cap slows every kernel by about
    the same factor (small spread); a co-tenant slows some kernels a lot and others not at all
    (large spread); one regressed operator slows few kernels. Step totals cannot tell these
    apart. The raw spread carries the run's own kernel jitter, so a cap's and a co-tenant's
    overlap; against the run's ordinary steps a co-tenant's scatter stands ~10× out and a cap's
    ~1.4× (sim-eval-v4's four of each). Steps whose ranks launched different kernel counts get
    zeros."""
    shapes: dict[int, np.ndarray] = {}
    scatter: dict[int, float] = {}
    for iteration, sequences in kernel_sequences(tree).items():
        counts = {len(rows) for _, rows in sequences}
        if len(sequences) < 2 or len(counts) != 1 or 0 in counts:
            continue
        durations = np.stack([tree.dur[rows] for _, rows in sequences]).astype(np.float64)
        logs = np.log(np.maximum(durations, 1.0))
        ratios = logs - np.median(logs, axis=0, keepdims=True)
        slowest = ratios[int(ratios.mean(axis=1).argmax())]
        shapes[iteration] = np.array(
            [
                np.clip(np.median(slowest), -3, 3),
                np.clip(slowest.std(), 0, 3),
                np.clip(np.percentile(slowest, 90), -3, 3),
                (slowest > 0.1).mean(),
                0.0,
            ],
            dtype=np.float32,
        )
        scatter[iteration] = float(np.median(np.abs(slowest - np.median(slowest))))
    if scatter:
        usual = max(float(np.median(list(scatter.values()))), 1e-3)
        for iteration, value in scatter.items():
            shapes[iteration][4] = np.clip(np.log(max(value, 1e-6) / usual), -2, 4) / 2
    return shapes


def _aligned_logs(
    tree: CallTree, log_paths: Sequence[Path]
) -> tuple[dict[int, tuple[np.ndarray, np.ndarray, list[str]]], dict[int, np.ndarray]]:
    """Per iteration: the hashed templates, numeric fields and raw text of its aligned log lines
    (warnings and errors first, then in file order; at most MAX_LOG_LINES); and the request
    queue the logs' arrivals and the steps' admissions leave (`_queue_floats`)."""
    if not log_paths:
        return {}, {}
    from teller.align.align import align_tree

    result = align_tree(tree, list(log_paths))
    table = result.logs.table
    step = result.alignment.step
    templates = table.column("template_id").to_pylist()
    fields = table.column("fields").to_pylist()
    queues = _queue_floats(tree, result.requests.waiting(tree), _kv_usage(step, fields))
    levels = table.column("level").to_pylist()
    raw = table.column("raw").to_pylist()
    by_step: dict[int, list[int]] = {}
    for i, s in enumerate(step.tolist()):
        if s >= 0:
            by_step.setdefault(int(s), []).append(i)
    out = {}
    for s, rows in by_step.items():
        rows = sorted(rows, key=lambda i: (levels[i] not in ("WARNING", "ERROR"), i))
        rows = rows[:MAX_LOG_LINES]
        floats = np.zeros((len(rows), LOG_FLOATS), dtype=np.float32)
        for j, i in enumerate(rows):
            floats[j] = _numeric_fields(fields[i])
            floats[j, -1] = levels[i] in ("WARNING", "ERROR")
        buckets = np.array([log_bucket(templates[i] or 0, 64) for i in rows], dtype=np.int64)
        out[s] = (buckets, floats, [raw[i] for i in rows])
    return out, queues


#: Share of the run's largest step (in tokens) under which a step still had token budget left.
TOKEN_ROOM = 0.8


#: Log fields that state the KV cache's fill, and the scale that makes them a fraction: vLLM's
#: `GPU KV cache usage: 45.2%` and SGLang's `token usage: 0.45`. TensorRT-LLM's iteration JSON
#: states free and total blocks instead (`Free KV cache blocks`, `Max KV cache blocks`).
KV_USAGE_FIELDS = {
    "gpu_kv_cache_usage_pct": 0.01,
    "kv_cache_usage_pct": 0.01,
    "token_usage": 1.0,
    "kv_cache_usage": 1.0,
}
KV_BLOCK_FIELDS = ("free_kv_cache_blocks", "max_kv_cache_blocks")


def _kv_usage(step: np.ndarray, fields: list[str | None]) -> dict[int, float]:
    """Step ordinal → the KV cache's fill (0-1) the step's aligned log lines state (the last
    one, where several do).

    Why: a full cache (preemptions) and a scheduler capped too low both leave requests waiting
    while batches shrink; only the cache's fill tells them apart, and the engine prints it."""
    usage: dict[int, float] = {}
    for s, text in zip(step.tolist(), fields, strict=True):
        if s < 0 or not text or ("usage" not in text and "kv_cache_blocks" not in text):
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            continue
        free, total = (data.get(key) for key in KV_BLOCK_FIELDS)
        for key, scale in KV_USAGE_FIELDS.items():
            if isinstance(data.get(key), int | float):
                usage[int(s)] = float(np.clip(data[key] * scale, 0.0, 1.0))
                break
        else:
            if isinstance(free, int | float) and isinstance(total, int | float) and total > 0:
                usage[int(s)] = float(np.clip(1.0 - free / total, 0.0, 1.0))
    return usage


def _queue_floats(
    tree: CallTree, waiting: dict[int, int], kv_usage: dict[int, float]
) -> dict[int, np.ndarray]:
    """Per iteration: log1p(requests waiting) / 4, the step's requests and tokens against the
    run's largest batch (log ratios; 0 where the steps do not state their batch), and
    log1p(requests held back) / 4: waiting requests the step had room for, by the run's own
    largest batch, while its tokens stayed under `TOKEN_ROOM` of the run's largest; then the KV
    cache's fill (0-1, the last the logs stated at or before the step) and 1 where it is known.

    Why: a scheduler capped too low leaves requests queued while batches run below what the
    engine ran before, and steps get shorter, not longer; no step time or operator shows it. The
    queue comes from the logs (arrivals), so it travels in the log modality and is absent with
    them. Held back: a run that starts with a queue admits at its token budget (full batches of
    prefill while requests wait, nothing held back); a saturated run has no room; a capped
    scheduler leaves room and budget unused while requests wait, which is the fault itself."""
    steps = tree.steps
    if not (waiting or kv_usage) or not len(steps):
        return {}
    rows = np.flatnonzero(steps.rank == steps.rank.min())
    requests = np.maximum(steps.context_requests[rows], 0) + np.maximum(
        steps.generation_requests[rows], 0
    )
    tokens = np.maximum(steps.context_tokens[rows], 0) + np.maximum(
        steps.generation_tokens[rows], 0
    )
    most_requests, most_tokens = requests.max(), tokens.max()
    out = {}
    fill = None
    for k in np.argsort(steps.index[rows], kind="stable").tolist():
        iteration = int(steps.index[rows[k]])
        fill = kv_usage.get(iteration, fill)
        if iteration not in waiting and fill is None:
            continue
        values = np.zeros(LOG_FLOATS, dtype=np.float32)
        if iteration in waiting:
            values[0] = np.log1p(waiting[iteration]) / 4.0
            if most_requests > 0:
                values[1] = np.clip(safe_log_ratio(requests[k], most_requests), -4, 0)
            if most_tokens > 0:
                values[2] = np.clip(safe_log_ratio(tokens[k], most_tokens), -8, 0) / 2.0
            if tokens[k] < TOKEN_ROOM * most_tokens:
                room = max(int(most_requests - requests[k]), 0)
                values[3] = np.log1p(min(waiting[iteration], room)) / 4.0
        if fill is not None:
            values[4], values[5] = fill, 1.0
        out[iteration] = values
    return out


def _numeric_fields(text: str | None) -> np.ndarray:
    """The first LOG_FLOATS-1 numeric fields of a line (by key order), log-scaled."""
    values = np.zeros(LOG_FLOATS, dtype=np.float32)
    if not text:
        return values
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return values
    numbers = [v for _, v in sorted(data.items()) if isinstance(v, int | float)]
    for j, v in enumerate(numbers[: LOG_FLOATS - 1]):
        values[j] = np.sign(v) * np.log1p(abs(float(v))) / 10.0
    return values


def train_vocab(records: Sequence[StepRecord], vocab_size: int) -> TPE:
    """A TPE vocabulary learned from the candidate paths of the training records."""
    slices = [path for record in records for path in record.paths]
    # plain pair counts, as the shipped model's vocabulary was learned (before slice-weighted
    # merges became TPE's default): the model's tokens stay what its weights were trained on
    return TPE.train(slices, vocab_size, weighting="node")


def path_tokens(tpe: TPE, path: Slice, raw: bool) -> list[tuple[int, int, int, int, int]]:
    """(kind id, layer, rank, dur_ns, depth) per token of an ancestor path, root first.

    With `raw`, every node is its own token with its base kind (no merges)."""
    if raw:
        return [
            (
                tpe.kind_id(int(path.layer[i]), path.node_name(i)),
                int(path.layer[i]),
                int(path.rank[i]),
                int(path.dur[i]),
                int(path.depth[i]),
            )
            for i in range(len(path))
        ]
    tokens = tpe.encode(path)
    out = []
    for t in range(len(tokens)):
        first = int(tokens.offsets[t])
        position = int(tokens.position[first])
        out.append(
            (
                int(tokens.kind[t]),
                int(path.layer[position]),
                int(tokens.rank[first]),
                int(tokens.dur_ns[t]),
                int(tokens.depth[t]),
            )
        )
    return out


def encode(
    records: Sequence[StepRecord],
    tpe: TPE,
    raw: bool = False,
    log_vocab: int = 64,
    words: WordVocab | None = None,
) -> dict[str, np.ndarray]:
    """Padded arrays for `RootCauseModel`; `focus_candidate[b, t]` maps a token to its candidate;
    with `words`, the explanation targets too (`y_words`: <bos> words <eos>, 0-padded)."""
    n = len(records)
    arrays = {
        "tok_kind": np.zeros((n, MAX_TRACE_TOKENS), np.int64),
        "tok_layer": np.zeros((n, MAX_TRACE_TOKENS), np.int64),
        "tok_rank": np.zeros((n, MAX_TRACE_TOKENS), np.int64),
        "tok_ckind": np.zeros((n, MAX_TRACE_TOKENS), np.int64),
        "tok_role": np.zeros((n, MAX_TRACE_TOKENS), np.int64),
        "tok_float": np.zeros((n, MAX_TRACE_TOKENS, TOKEN_FLOATS), np.float32),
        "focus_candidate": np.full((n, MAX_TRACE_TOKENS), -1, np.int64),
        "step_float": np.zeros((n, STEP_FLOATS), np.float32),
        "log_template": np.zeros((n, MAX_LOG_LINES), np.int64),
        "log_float": np.zeros((n, MAX_LOG_LINES, LOG_FLOATS), np.float32),
        "y_step": np.zeros(n, np.float32),
        "y_ptr": np.full(n, -1, np.int64),
        "y_fault": np.zeros(n, np.int64),
    }
    for b, record in enumerate(records):
        arrays["step_float"][b] = record.step_float
        lines = min(len(record.log_template), MAX_LOG_LINES)
        arrays["log_template"][b, :lines] = (record.log_template[:lines] - 1) % log_vocab + 1
        arrays["log_float"][b, :lines] = record.log_float[:lines]
        if record.queue is not None:  # its own template slot, after the hashed buckets
            slot = min(lines, MAX_LOG_LINES - 1)
            arrays["log_template"][b, slot] = log_vocab + 1
            arrays["log_float"][b, slot] = record.queue
        t = 0
        for c, (candidate, path) in enumerate(zip(record.candidates, record.paths, strict=True)):
            tokens = path_tokens(tpe, path, raw)[-PATH_TOKENS:]
            for j, (kind, layer, rank, dur_ns, depth) in enumerate(tokens):
                focus = j == len(tokens) - 1
                arrays["tok_kind"][b, t] = kind
                arrays["tok_layer"][b, t] = layer
                arrays["tok_rank"][b, t] = rank
                arrays["tok_role"][b, t] = ROLE_FOCUS if focus else ROLE_CONTEXT
                floats = arrays["tok_float"][b, t]
                floats[0] = np.log1p(dur_ns / 1e3) / 10.0
                floats[1] = depth / 20.0
                if focus:
                    kind = _KIND_AS.get(candidate.kind, candidate.kind)
                    arrays["tok_ckind"][b, t] = CANDIDATE_KINDS.index(kind)
                    arrays["focus_candidate"][b, t] = c
                    floats[2] = safe_log_ratio(candidate.observed_ns, candidate.normal_ns)
                    floats[3] = np.log1p(max(candidate.score, 0.0) / 1e3) / 10.0
                    floats[4] = np.clip(candidate.z / 100.0, -3.0, 3.0)
                    floats[5] = c / MAX_CANDIDATES
                    if c == record.target:
                        arrays["y_ptr"][b] = t
                t += 1
        arrays["y_step"][b] = float(record.anomalous)
        arrays["y_fault"][b] = FAULT_NAMES.index(record.fault)
    if words is not None:
        arrays["y_words"] = np.zeros((n, MAX_WORDS + 1), np.int64)
        for b, record in enumerate(records):
            if record.anomalous:
                ids = words.encode(record.words)
                arrays["y_words"][b, : len(ids)] = ids
    return arrays


def read_case_records(case_dir: Path, use_logs: bool = True) -> list[StepRecord]:
    """Records of one labelled case directory (labels.json, traces/, logs/)."""
    from teller.callchain.tree import build_tree
    from teller.ingest import find_trace_files, read_run

    case = CaseDir(Path(case_dir))
    labels = CaseLabels.read(case.root)
    tree = build_tree(read_run(find_trace_files([case.trace_root()])))
    logs = case.log_files() if use_logs else []
    return case_records(tree, case.root.name, labels, logs)
