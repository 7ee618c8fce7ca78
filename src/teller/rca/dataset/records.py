"""A case's steps as the model's examples: one `StepRecord` per step (iteration), all ranks.

Reading a case is the slow part (trees of 10⁵ nodes), so it happens once, into records that keep
only what an example needs: the step's numeric features, the localizer's top candidates with the
ancestor path of each (a small `Slice`, so the TPE vocabulary can be trained on them and any
vocabulary can encode them later), the step's aligned log lines and request queue, and the
labels. Everything comes from stages already run: the tree, its `RunFacts`, and the run's one
alignment of logs and spans (`teller.align.align_tree`, as `teller analyze` computes it).

Bounded sequences: the localizer (run with thresholds low enough to over-propose) narrows a step
of 10⁴–10⁵ nodes to `MAX_CANDIDATES` candidate nodes; each brings at most `PATH_TOKENS` tokens of
context (the deepest ones of its ancestor path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from teller.callchain.facts import Arrivals, RunFacts
from teller.callchain.tree import CallTree
from teller.labels import CaseLabels
from teller.layout import CaseDir
from teller.localize import (
    NumericLocalizer,
    OperatorCandidate,
    StepScore,
    keep_top,
    transfer_residuals,
)
from teller.rca.context import RunContext
from teller.rca.dataset.features import (
    add_context,
    kernel_slowdown_shape,
    log_features,
    step_features,
    work_features,
)
from teller.rca.dataset.targets import step_labels
from teller.rca.inputs import LOG, MAX_CANDIDATES, STEP
from teller.slices.cut import slice_of_nodes
from teller.slices.slice import Slice

if TYPE_CHECKING:
    from teller.align.align import AlignResult

#: Which steps count as not normal when operators are measured against the normal steps: far
#: below the localizer's own thresholds (5σ, 15%), so borderline steps are not anyone's reference.
#: Every step gets its ranked candidates all the same (`candidate_z=-inf`): a delayed link or a
#: swapped kernel slows a step by less than its batch's spread, yet its collective or its new
#: kernel stands out among the step's operators, and the model, not a threshold, decides.
PROPOSE_Z = 3.0
PROPOSE_RATIO = 1.03
#: PyTorch profiler's name prefix of module scopes (with_modules / with_stack traces).
_MODULE_PREFIX = "nn.Module: "


@dataclass
class StepRecord:
    """Everything one example needs, cut out of a case once."""

    case_id: str
    iteration: int
    step_float: np.ndarray  # (STEP.width,), read-only: shared by every record of the step
    candidates: list[OperatorCandidate]
    paths: list[Slice]  # ancestor path of each candidate's node, the node last
    log_template: np.ndarray  # int, hashed template buckets (0 = none)
    log_float: np.ndarray  # (lines, LOG.width)
    log_lines: list[str]
    queue: np.ndarray | None  # (QUEUE.width,) the request queue at the step, from the logs
    localizer_anomalous: bool
    expected_ns: int
    dur_ns: int
    #: waiting requests the step had room for and left waiting
    #: (`teller.align.requests.held_back_requests`); None where the run's queue or its steps'
    #: batches are unknown
    held_back: int | None = None
    #: requests the engine's logs say it preempted in the step (`AlignResult.preempted`); None
    #: without logs
    preempted: int | None = None
    #: the KV cache's fill (0-1) a log line aligned to the step states (`AlignResult.kv_fill`);
    #: None where none does
    kv_cache_fill: float | None = None
    # labels (None/False without a labels.json)
    anomalous: bool = False
    fault: str = "none"
    target: int = -1  # index into candidates of the guilty one, -1 unknown/none
    mechanism: str | None = None  # the explanation head's target (`teller.rca.plans.MECHANISMS`)
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StepTrace:
    """What the trace alone says about one step: its numeric features and its candidates."""

    score: StepScore
    step_float: np.ndarray
    candidates: tuple[OperatorCandidate, ...]
    paths: tuple[Slice, ...]
    localizer_anomalous: bool


def case_records(
    tree: CallTree,
    case_id: str,
    labels: CaseLabels | None = None,
    alignment: AlignResult | None = None,
    facts: RunFacts | None = None,
) -> list[StepRecord]:
    """One record per iteration of the tree. `alignment`: the run's logs and spans placed on
    its steps (None: no log modality); `facts`: the tree's `RunFacts` where the caller has them
    (computed here otherwise).

    The trace's side of the records depends on the tree alone, so it is kept in `facts`: every
    caller that shares them (the model variants of one evaluation case) computes it once."""
    facts = RunFacts.of(tree, facts)
    traced = facts.derived("rca.step_traces", lambda: step_traces(tree, facts))
    logs, queues = log_features(tree, alignment)
    held_back = alignment.held_back if alignment is not None else {}
    preempted = alignment.preempted if alignment is not None else None
    kv_fill = alignment.kv_fill if alignment is not None else {}
    records = []
    for step in traced:
        templates, floats, lines = logs.get(step.score.iteration) or _no_lines()
        records.append(
            StepRecord(
                case_id=case_id,
                iteration=step.score.iteration,
                step_float=step.step_float,
                candidates=list(step.candidates),
                paths=list(step.paths),
                log_template=templates,
                log_float=floats,
                log_lines=lines,
                queue=queues.get(step.score.iteration),
                localizer_anomalous=step.localizer_anomalous,
                expected_ns=step.score.expected_ns,
                dur_ns=step.score.dur_ns,
                held_back=held_back.get(step.score.iteration),
                preempted=(None if preempted is None else preempted.get(step.score.iteration, 0)),
                kv_cache_fill=kv_fill.get(step.score.iteration),
            )
        )
    if labels is not None:
        labels = labels.keyed_to(tree.steps)
        normal = (
            [r.iteration for r in records]
            if not labels.is_fault
            else [r.iteration for r in records if r.iteration not in set(labels.steps)]
        )
        context = RunContext(tree, facts, normal, has_logs=alignment is not None)
        for record in records:
            score = StepScore(record.iteration, "", record.dur_ns, record.expected_ns, 0.0, True)
            truth = step_labels(score, record.candidates, labels, context)
            record.anomalous, record.fault = truth.anomalous, truth.fault
            record.target, record.mechanism = truth.target, truth.mechanism
    return records


def _no_lines() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A step's log side without aligned lines."""
    return np.zeros(0, np.int64), np.zeros((0, LOG.width), np.float32), []


def step_traces(tree: CallTree, facts: RunFacts) -> list[StepTrace]:
    """The trace's side of every step's record, in the localizer's step order (a hang's
    unfinished step has no step node to encode, and no record).

    The few-step comparisons (a step's own layers, `teller.localize.layers`, and the same
    launch across steps and ranks, `teller.localize.repeats`) stay out of the records: the
    shipped checkpoints learned from candidate sets without them, and the runs the model
    answers (8+ engine steps per rank, 2+ ranks) give the step model its references."""
    few_steps = dict(layer_share=None, repeat_share=None)
    localization = NumericLocalizer(
        step_z=PROPOSE_Z,
        min_ratio=PROPOSE_RATIO,
        top_k=MAX_CANDIDATES,
        candidate_z=-np.inf,
        **few_steps,
    ).score(tree, facts)
    strict = NumericLocalizer(**few_steps)
    work = work_features(tree, facts)
    kernel_shapes = kernel_slowdown_shape(tree)
    transfers = transfer_residuals(tree, facts)
    collectives = _last_arrivals(facts.arrivals)
    forwards = _forward_nodes(tree)
    scores, vectors, candidate_lists = [], [], []
    for score in localization.steps:
        if score.kind == "unfinished":
            continue
        vector = step_features(
            tree,
            score,
            strict,
            work[score.iteration],
            localization.shifted.get(score.iteration, 0.0),
            kernel_shapes.get(score.iteration, {}),
            transfers.get(score.iteration, (0.0, 0.0)),
        )
        candidates = localization.candidates.get(score.iteration, [])
        extras = [
            _collective_candidate(tree, collectives, transfers, score, candidates),
            _forward_candidate(tree, forwards, score, candidates),
        ]
        extras = [c for c in extras if c is not None]
        if extras:
            candidates = [*keep_top(candidates, MAX_CANDIDATES - len(extras)), *extras]
        scores.append(score)
        vectors.append(vector)
        candidate_lists.append(candidates)
    add_context([vectors[i] for i in np.argsort([s.iteration for s in scores], kind="stable")])
    traced = []
    for score, vector, candidates in zip(scores, vectors, candidate_lists, strict=True):
        vector.flags.writeable = False
        traced.append(
            StepTrace(
                score=score,
                step_float=vector,
                candidates=tuple(candidates),
                paths=tuple(slice_of_nodes(tree, [c.node]) for c in candidates),
                localizer_anomalous=bool(vector[STEP["flagged"]]),
            )
        )
    return traced


def read_case_records(case_dir: Path, use_logs: bool = True) -> list[StepRecord]:
    """Records of one labelled case directory (labels.json, traces/, logs/, otlp/); with
    `use_logs`, its logs and spans aligned once, as `teller analyze` aligns them."""
    from teller.align.align import read_on_one_clock

    case = CaseDir(Path(case_dir))
    labels = CaseLabels.read(case.root)
    tree = read_on_one_clock([case.trace_root()])[0].tree
    alignment = case_alignment(tree, case) if use_logs else None
    return case_records(tree, case.root.name, labels, alignment)


def case_alignment(
    tree: CallTree, case: CaseDir, log_paths: Sequence[Path] | None = None
) -> AlignResult | None:
    """The case's logs (`log_paths`, by default its own) and spans placed on the tree's steps;
    None where it has neither."""
    logs = case.log_files() if log_paths is None else list(log_paths)
    spans = case.otlp_files()
    if not logs and not spans:
        return None
    from teller.align.align import align_tree

    return align_tree(tree, logs, spans)


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
    rows = np.flatnonzero(arrivals.is_last)
    out: dict[int, tuple[int, int, int]] = {}
    totals: dict[tuple[int, int], float] = {}
    longest: dict[tuple[int, int], int] = {}
    own_ns = arrivals.own_ns
    for i in rows.tolist():
        key = (int(arrivals.iteration[i]), int(arrivals.rank[i]))
        totals[key] = totals.get(key, 0.0) + float(own_ns[i])
        if key not in longest or own_ns[i] > own_ns[longest[key]]:
            longest[key] = i
    for (iteration, rank), total in totals.items():
        if iteration not in out or total > out[iteration][2]:
            out[iteration] = (rank, int(arrivals.node[longest[(iteration, rank)]]), int(total))
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
    in many of a link fault's steps no candidate would be the guilty collective: the pointer
    would have nothing right to point at. The step's transfer residual (`transfer_ratio`,
    `transfer_z`) says how far off the transfer is; this gives that number a node. Skipped when
    the localizer already proposes that node."""
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
