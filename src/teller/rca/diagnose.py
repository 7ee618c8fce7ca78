"""Turn the pipeline's numbers into a verdict a person can act on.

TELLER's split of work: the numeric localizer narrows a step of 10⁴–10⁵ nodes to a few candidate
operators and measures how far each strays from normal; the root-cause model (`teller.rca.infer`)
decides which steps are anomalous, points at one candidate and names the fault. The verdict is the
model's (`method="model"`, the default), with the localizer's numbers beside it as evidence: the
step's robust z-score and expected duration, each candidate's observed time against its normal.
`method="localizer"` gives the localizer's own verdict, and is what a run falls back to, with a
warning, when the model cannot be loaded (torch missing, no checkpoint), so `analyze` never fails
for lack of a model.

It also says what was missing from the inputs and what that costs, so a verdict from traces alone
is never mistaken for a verdict with logs.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from teller.align.host import HostSteps
from teller.callchain.facts import RunFacts
from teller.callchain.render import short_name
from teller.callchain.steps import BATCHED_STEP_KINDS
from teller.callchain.tree import CallTree
from teller.errors import TellerError
from teller.faults import ENGINE_WIDE_FAULTS, FAULTS, HOST_SLOWDOWNS, engine_wide, view_of
from teller.ingest.schema import LAYERS
from teller.localize import Localization, OperatorCandidate, StepExplanation, StepScore
from teller.localize.collectives import own_share
from teller.rca.context import Measured, RunContext
from teller.rca.dataset import StepRecord, case_records
from teller.rca.explain import choose_mechanism, compose
from teller.rca.host import (
    HELD_SHARE,
    LINK_FAULTS,
    held_off_by_step,
    held_off_share,
    pooled_fault,
    retyping_readings,
    stated_reading,
)
from teller.rca.link_size import SizeGrowth, size_growth
from teller.rca.verdict import Evidence, Finding, LogLine, StepRow, Verdict

if TYPE_CHECKING:
    from teller.align.align import AlignResult
    from teller.rca.infer import StepDiagnosis

#: The fault type a step's excess inside its collectives' own time points to: a slower link.
LINK_FAULT = "net_throttle"

#: Findings listed in the summary; the rest are in the JSON and the HTML report.
SUMMARY_FINDINGS = 3

#: What produces the findings: the root-cause model (default) or the numeric localizer alone.
METHODS = ("model", "localizer")

#: The warning a verdict carries when the model was asked for but could not run.
MODEL_UNAVAILABLE = "root-cause model unavailable"


class ModelUnavailable(Exception):
    """The model could not be imported, loaded or run; the reason is the message."""


class OutsideTraining(ModelUnavailable):
    """The run is not of the shape the model learned from; what differs is the message."""


#: The shape of run the shipped model learned from (its README): engine steps with a batch
#: composition, many of them, on one GPU or many. Outside it, its step inputs (neighbour steps,
#: a step's z-score against its batch) are not what it saw, and the localizer, which compares
#: whatever the run offers, answers instead.
TRAINED_STEP_KINDS = BATCHED_STEP_KINDS
TRAINED_MIN_STEPS = 8


def outside_training(tree: CallTree) -> str | None:
    """How the run differs from what the model was trained on, or None when it does not."""
    ranks = len(set(tree.steps.rank.tolist()))
    per_rank = len(tree.steps) // max(ranks, 1)
    kinds = set(tree.steps.kind)
    gaps = []
    if not kinds & TRAINED_STEP_KINDS:
        gaps.append(f"steps without an engine batch ({', '.join(sorted(kinds))})")
    if per_rank < TRAINED_MIN_STEPS:
        gaps.append(
            f"{per_rank} step{'s' if per_rank != 1 else ''} per rank (it needs {TRAINED_MIN_STEPS})"
        )
    return ", ".join(gaps) if gaps else None


@dataclass
class RunInputs:
    """What a verdict was drawn from: its header lists the files, its notes say what was missing."""

    trace_files: list[Path]
    log_files: list[Path]
    otlp_files: list[Path]
    ranks: list[int]
    warnings: list[str] = field(default_factory=list)  # the readers' and the tree's


@dataclass
class ModelOutcome:
    """The root-cause model's diagnosis of every step, with the checkpoint's name."""

    name: str
    diagnoses: list[StepDiagnosis]


def diagnose(
    tree: CallTree,
    localization: Localization,
    alignment: AlignResult | None,
    inputs: RunInputs,
    model: ModelOutcome | None = None,
    notes: Sequence[str] = (),
    facts: RunFacts | None = None,
    host: HostSteps | None = None,
) -> Verdict:
    """The run's verdict: the model's where `model` is given, else the localizer's alone.

    Every argument is a stage's output, computed once by whoever runs the pipeline (the
    `Analysis` facade, the evaluation harness); `notes` are warnings the caller adds (the model
    that could not be loaded); `facts`: the tree's `RunFacts`, which the explanations read;
    `host`: the host counters on the steps, where `teller collect` sampled them (a host
    slowdown's fault type is then the one they name, `teller.rca.host`)."""
    has_logs = bool(inputs.log_files) or alignment is not None
    if model is not None:
        # a hang's unfinished step has no step record for the model: the localizer's finding
        unfinished = [s for s in localization.anomalous_steps() if s.kind == "unfinished"]
        flagged = {d.iteration for d in model.diagnoses if d.anomalous}
        drafts = _drafts(tree, localization, unfinished) + _model_drafts(
            localization, model.diagnoses
        )
        produced_by = f"model:{model.name}"
    else:
        flagged = {s.iteration for s in localization.anomalous_steps()}
        drafts = _drafts(tree, localization)
        produced_by = "localizer"
    normal = {s.iteration for s in localization.steps if s.iteration not in flagged}
    held_back = alignment.held_back if alignment is not None else None
    preempted = alignment.preempted if alignment is not None else None
    context = RunContext(tree, facts, normal, has_logs, host, held_back, preempted)
    apply_run_rules(drafts, context)
    findings = by_incident([_finding(tree, context, d) for d in drafts])
    _attach_logs(alignment, findings)
    return Verdict(
        inputs=[str(p) for p in inputs.trace_files],
        ranks=inputs.ranks,
        method=produced_by,
        summary=summary_of(
            findings,
            len(localization.steps),
            lambda: nothing_found(tree.steps.rank, tree.steps.kind, len(localization.steps)),
        ),
        findings=findings,
        steps=_step_rows(tree, localization, flagged),
        missing=missing_inputs(inputs),
        warnings=[*notes, *inputs.warnings, *tree.warnings]
        + (alignment.warnings if alignment else []),
    )


def model_records(
    tree: CallTree,
    alignment: AlignResult | None,
    case_id: str = "",
    facts: RunFacts | None = None,
) -> list[StepRecord]:
    """The model's inputs, one record per step; `ModelUnavailable` where the model cannot answer
    the run. `alignment`: the run's logs and spans on its steps, the one the verdict attaches its
    log lines from.

    Built without torch (`run_model` imports it), so a caller can score the run and let go of
    the scorings' per-node tables before torch's own few hundred MB are loaded beside them."""
    if not len(tree.steps):
        raise ModelUnavailable("the trace has no engine steps for it to diagnose")
    gap = outside_training(tree)
    if gap is not None:
        raise OutsideTraining(gap)
    if importlib.util.find_spec("torch") is None:
        raise ModelUnavailable("cannot import torch: it is not installed")
    return case_records(tree, case_id, None, alignment, facts)


def run_model(
    records: Sequence[StepRecord],
    tree: CallTree,
    model_dir: Path | None = None,
    host: HostSteps | None = None,
) -> ModelOutcome:
    """The model's diagnosis of every step (`model_records`); `ModelUnavailable` when it cannot
    run. `host`: the host counters on the tree's steps, where `teller collect` sampled them.

    torch is imported here and only here, so commands that never diagnose (`teller info`) and
    installs without torch keep working."""
    try:
        from teller.rca.infer import DEFAULT_MODEL, LoadedModel
    except (ImportError, OSError) as error:  # torch or safetensors missing or broken
        raise ModelUnavailable(f"cannot import torch: {error}") from None
    try:
        model = LoadedModel.load(model_dir)
    except (OSError, RuntimeError, TellerError) as error:
        raise ModelUnavailable(str(error)) from None
    name = "default" if model.path.resolve() == DEFAULT_MODEL.resolve() else model.path.name
    held = held_off_share(tree, host) if host is not None else None
    try:
        return ModelOutcome(name, model.diagnose_records(records, held_share=held))
    except RuntimeError as error:  # torch's own failures: a checkpoint that does not fit
        raise ModelUnavailable(f"{model.path}: {error}") from None


def unavailable_note(error: ModelUnavailable) -> str:
    """The warning a verdict carries when the model was asked for but could not run."""
    if isinstance(error, OutsideTraining):
        return (
            f"{MODEL_UNAVAILABLE} for this run, which is outside what it was trained on "
            f"(engine steps, at least {TRAINED_MIN_STEPS} per rank): "
            f"{error}. The verdict is the numeric localizer's, which compares the run's own "
            "steps, layers and ranks"
        )
    return f"{MODEL_UNAVAILABLE} ({error}); the verdict is the numeric localizer's alone"


@dataclass
class _Draft:
    """A flagged step before it becomes a finding: its ranked candidates (with the model
    pointer's probabilities, or None under the localizer), which of them the finding names, the
    fault type, and the explanation head's mechanism scores (None: the fault's default)."""

    score: StepScore
    ranked: list[tuple[OperatorCandidate, float | None]]
    fault: str | None
    view: str
    probability: float | None = None
    mechanism_scores: Sequence[float] | None = None
    chosen: int = 0  # index into `ranked` of the named candidate
    #: whether the explanation states the fault type's cause: the model's head names it; the
    #: localizer's type rests on evidence only for arrivals, transfers, shifts and hangs
    state_cause: bool = True
    #: a slow link's collectives over its incident's steps, by size (`type_link_by_size`)
    link_growth: SizeGrowth | None = None

    @property
    def top(self) -> OperatorCandidate | None:
        return self.ranked[self.chosen][0] if self.ranked else None

    @property
    def named_first(self) -> list[tuple[OperatorCandidate, float | None]]:
        """`ranked` with the named candidate moved to the front."""
        ranked, k = self.ranked, self.chosen
        return [*ranked[k : k + 1], *ranked[:k], *ranked[k + 1 :]]


def localizer_explanations(
    tree: CallTree,
    localization: Localization,
    facts: RunFacts | None = None,
    has_logs: bool = False,
    host: HostSteps | None = None,
) -> dict[int, StepExplanation]:
    """The localizer's explanation of each flagged step, as its verdict words it (the same
    plans, the same one-incident rule, the same fault type from the host counters where `host`
    holds them), with the fault type and the node it names: what the scoreboard judges the
    localizer's words by."""
    flagged = {s.iteration for s in localization.anomalous_steps()}
    drafts = _drafts(tree, localization)
    named = _named(tree, localization, drafts, flagged, facts, has_logs, host)
    return {step: explanation for step, (_, explanation) in named.items()}


def model_explanations(
    tree: CallTree,
    localization: Localization,
    diagnoses: list[StepDiagnosis],
    facts: RunFacts | None = None,
    has_logs: bool = False,
    host: HostSteps | None = None,
    held_back: dict[int, int] | None = None,
    preempted: dict[int, int] | None = None,
) -> dict[int, tuple[list[tuple[OperatorCandidate, float | None]], StepExplanation]]:
    """The model's findings as its verdict points and words them: per flagged step, its
    candidates with the one the finding names first (the pointer's pick, or the straggler's
    candidate the one-incident rule re-points a peer's finding at, which may be its own share of
    a collective the pointer never saw) and its explanation, typed by the host counters where
    `host` holds them. What the scoreboard scores the model by, so that it scores the verdict a
    user reads, not the pointer and fault head before the verdict's rules."""
    flagged = {d.iteration for d in diagnoses if d.anomalous}
    drafts = _model_drafts(localization, diagnoses)
    return _named(tree, localization, drafts, flagged, facts, has_logs, host, held_back, preempted)


def _named(
    tree: CallTree,
    localization: Localization,
    drafts: list[_Draft],
    flagged: set[int],
    facts: RunFacts | None,
    has_logs: bool,
    host: HostSteps | None,
    held_back: dict[int, int] | None = None,
    preempted: dict[int, int] | None = None,
) -> dict[int, tuple[list[tuple[OperatorCandidate, float | None]], StepExplanation]]:
    """Each draft's candidates, the named one first, and explanation after the verdict's rules
    (`apply_run_rules`), as `diagnose` applies them."""
    normal = {s.iteration for s in localization.steps} - flagged
    context = RunContext(tree, facts, normal, has_logs, host, held_back, preempted)
    apply_run_rules(drafts, context)
    out = {}
    for draft in drafts:
        finding = _finding(tree, context, draft)
        out[finding.step] = (
            draft.named_first,
            StepExplanation(
                finding.fault_type or "none", finding.explanation, finding.operator, finding.rank
            ),
        )
    return out


def _model_drafts(localization: Localization, diagnoses: list[StepDiagnosis]) -> list[_Draft]:
    """One draft per step the model flags, most probable first: the step and the fault are the
    model's, the operator and rank are its pointer's pick among the localizer's candidates, and
    the numbers (step z-score, each candidate's observed time against normal) are the localizer's."""
    score_of = {s.iteration: s for s in localization.steps}
    flagged = [d for d in diagnoses if d.anomalous]
    z_of = {
        d.iteration: score_of[d.iteration].z if d.iteration in score_of else 0.0 for d in flagged
    }
    drafts = []
    for d in sorted(flagged, key=lambda d: (-d.probability, -z_of[d.iteration])):
        known = score_of.get(d.iteration)
        score = StepScore(
            iteration=d.iteration,
            kind=known.kind if known else "step",
            dur_ns=d.dur_ns,
            expected_ns=d.expected_ns,
            z=z_of[d.iteration],
            anomalous=True,
        )
        drafts.append(
            _Draft(
                score=score,
                ranked=[(c, p) for c, p in d.candidates],
                fault=d.fault,
                view=view_of(d.fault),
                probability=round(d.probability, 4),
                mechanism_scores=d.mechanism_scores,
            )
        )
    return drafts


#: Candidates a finding lists as evidence, the named one first.
EVIDENCE_SHOWN = 3


def _evidence_candidates(draft: _Draft) -> list[OperatorCandidate]:
    """The candidates a finding's evidence lines show: the named one first. A lock-stepped
    fault (`LOCKSTEP_FAULTS`) is one rank's, and its peers' longer operators in the step are
    what it cost them, so only the named rank's candidates are shown; the rest stay in the
    finding's candidate list."""
    ranked = [c for c, _ in draft.named_first]
    top = draft.top
    if top is not None and draft.fault in LOCKSTEP_FAULTS:
        ranked = [c for c in ranked if c.rank == top.rank]
    return ranked[:EVIDENCE_SHOWN]


def _finding(tree: CallTree, context: RunContext, draft: _Draft) -> Finding:
    """The finding of one draft, its explanation composed from the step's measured facts."""
    name_of_step = _step_names(tree)
    top = draft.top
    ranked = draft.named_first  # the named candidate leads the evidence
    step_context = replace(
        context.context(draft.score, top, [c for c, _ in ranked]), link_growth=draft.link_growth
    )
    mechanism = choose_mechanism(step_context, draft.fault, draft.mechanism_scores)
    explanation = compose(step_context, draft.fault, mechanism, draft.state_cause)
    alike = list(step_context.transfer_peers) if LINK_ALIKE_PLANS & set(explanation.plans) else []
    evidence = [_evidence(c) for c in _evidence_candidates(draft)]
    stated = stated_reading(step_context, draft.fault)
    if stated is not None and stated[0] != "major_faults" and top is not None:
        evidence.append(_host_evidence(top.rank, *stated))
    return Finding(
        step=draft.score.iteration,
        step_name=name_of_step.get(draft.score.iteration, ""),
        step_kind=draft.score.kind,
        step_dur_ns=draft.score.dur_ns,
        step_expected_ns=draft.score.expected_ns,
        score=_rounded_z(draft.score.z),
        probability=draft.probability,
        rank=top.rank if top else None,
        alike_ranks=alike,
        operator=top.operator if top else None,
        operator_node=top.node if top else None,
        fault_type=draft.fault,
        view=draft.view,
        explanation=explanation.text,
        candidates=[_candidate(c, p) for c, p in ranked],
        evidence=evidence,
    )


#: The caveats an explanation carries where the trace cannot tell the named rank's link from its
#: peers' (`teller.rca.explain`): the finding then lists those peers as `alike_ranks`.
LINK_ALIKE_PLANS = frozenset({"caveat.link_alike", "caveat.link_ends"})


def _step_names(tree: CallTree) -> dict[int, str]:
    return {int(tree.steps.index[k]): tree.steps.name[k] for k in range(len(tree.steps))}


#: Fault types whose guilty rank makes its tensor-parallel peers wait at the collectives: in a
#: lock-stepped group their symptom (a slow step, long collectives) shows on every rank.
LOCKSTEP_FAULTS = frozenset(f for f, view in FAULTS.items() if view == "V") | {"straggler"}


#: A peer keeps its own finding in a step where it was late by this share of the step's excess
#: (beyond its own wait there): a second cause, not the straggler's symptom.
OWN_LATENESS = 0.5

#: The straggler is clear when, over the flagged steps, its peers waited for it at least this many
#: times as long as it waited for them. A throttled or stalled rank's peers wait for it many
#: times over; a rank whose one operator regressed by a few percent of a step is late by little
#: more than the scheduling noise of a CPU-run collective, which can put the other rank ahead.
CLEAR_STRAGGLER = 3.0


def apply_run_rules(drafts: list[_Draft], context: RunContext) -> None:
    """The rules that read the run's flagged steps together, in order: one incident per cause
    (lateness), then, where host counters were sampled, the rank they show held off a CPU
    and the fault type they name, then a host slowdown that the steps' own transfers
    contradict (`type_by_transfer`), then a delay or rate limit that the collectives' sizes
    contradict (`type_link_by_size`)."""
    one_incident_per_cause(drafts, context)
    if context.host is not None:
        point_at_held_off_rank(drafts, context)
        pool_host_faults(drafts, context)
    type_by_transfer(drafts, context)
    type_link_by_size(drafts, context)


#: The link faults told apart by how a rank's collectives grew with their size.
DELAY_FAULT, RATE_LIMIT_FAULTS = "net_delay", frozenset({"net_throttle", "bandwidth_throttle"})
#: A rate limit's name by where its collectives ran: GPU ranks reach the network through their
#: node's NIC (a node's lost bandwidth), a CPU collective through the rank's own link.
GPU_RATE_LIMIT, CPU_RATE_LIMIT = "bandwidth_throttle", "net_throttle"


def type_link_by_size(drafts: list[_Draft], context: RunContext) -> None:
    """An engine's drafts of added latency take a rate limit's type where its named ranks'
    collectives in their steps grew with their message size, and its drafts of a rate limit
    take added latency's where they did not (`teller.rca.link_size.size_growth`); where the
    sizes cannot tell, the types stay. A rate limit is named by where the named collectives
    ran (`rate_limit_name`). The measurement stays on the drafts: the explanation quotes it.
    Why: a learned type head reads step-level numbers and calls one the other, and the
    explanation of a rate limit says the transfers grew with their size. An engine's drafts are
    read together because one slow link holds up every rank of the group that shares it: the
    pointer may name either end from step to step, and one draft's few collectives are too few
    to measure a growth by themselves."""
    by_engine: dict[int, list[_Draft]] = {}
    for draft in drafts:
        if draft.top is not None and (
            draft.fault == DELAY_FAULT or draft.fault in RATE_LIMIT_FAULTS
        ):
            engine = context.engine_of.get(draft.score.iteration, 0)
            by_engine.setdefault(engine, []).append(draft)
    for group in by_engine.values():
        growth = size_growth(
            context.tree, {d.top.rank for d in group}, {d.score.iteration for d in group}
        )
        if growth is None:
            continue
        rate_limit = rate_limit_name(group, context.tree) if growth.grows else DELAY_FAULT
        for draft in group:
            draft.link_growth = growth
            draft.fault, draft.view = rate_limit, view_of(rate_limit)


def rate_limit_name(group: list[_Draft], tree: CallTree) -> str:
    """`bandwidth_throttle` where most of the drafts' named operators ran on a GPU stream (an
    NCCL collective kernel), else `net_throttle` (a CPU collective such as gloo's over TCP)."""
    on_gpu = sum(int(tree.stream[d.top.node] >= 0) for d in group if d.top.node >= 0)
    return GPU_RATE_LIMIT if 2 * on_gpu > len(group) else CPU_RATE_LIMIT


def point_at_held_off_rank(drafts: list[_Draft], context: RunContext) -> None:
    """A step of several ranks whose named rank the host counters show held off a CPU for less
    than `HELD_SHARE` of its step time beyond its usual, while another of its ranks was held off
    for that share or more (the most held-off one, by at least `HELD_SHARE` more than the named
    rank), names that rank: its best candidate in the step, or where it has none, its own share
    of the step's collective that grew most (`own_share`). Why: in a lock-stepped group a
    throttled rank slows its peers too (a CPU-run collective's transfer waits on its threads),
    so a learned pointer or the lateness can fall on a peer, while the counters measure which
    rank lost the CPU. The fault type then follows from the counters (`pool_host_faults`)."""
    held = held_off_by_step(context.tree, context.host)
    for draft in drafts:
        top = draft.top
        ranks = held.get(draft.score.iteration, {})
        if top is None or draft.score.kind == "unfinished" or len(ranks) < 2:
            continue
        named = ranks.get(top.rank, 0.0)
        most = max(ranks, key=lambda r: ranks[r])
        if most != top.rank and named < HELD_SHARE and ranks[most] >= named + HELD_SHARE:
            _point_at_rank(draft, most, context)


def _point_at_rank(draft: _Draft, rank: int, context: RunContext) -> None:
    """Re-point `draft` at `rank`: its best candidate in the step, or where it has none, its
    own share of the step's collective that grew most (`own_share`); unchanged without either."""
    theirs = [i for i, (c, _) in enumerate(draft.ranked) if c.rank == rank]
    if theirs:
        draft.chosen = theirs[0]
        return
    share = own_share(
        context.tree,
        context.facts.arrivals,
        draft.score.iteration,
        rank,
        context.normal_like(draft.score.iteration),
    )
    if share is not None:
        draft.ranked.append((share, None))
        draft.chosen = len(draft.ranked) - 1


def pool_host_faults(drafts: list[_Draft], context: RunContext) -> None:
    """The drafts of one fault type on one rank take the fault their steps' host counters name
    together (`teller.rca.host`), where the readings that may re-type that type
    (`retyping_readings`) name one: any reading for a host slowdown, and for other types the
    time the rank was held off a CPU. The type then rests on measured counters, not on the layer
    a slower operator ran on or on a learned head's reading of the steps' shape, so the
    explanation states its cause (`state_cause`) as the summary states the type.

    A slow link's drafts are pooled over the engine's ranks (`_incidents`): one link holds up
    every rank that shares it, so a pointer may name either end from step to step, and one
    short step's run delay on the rank it happened to name is not the incident's cause."""
    host_run = collectives_on_host(context.tree)
    for (was, _), group in _incidents(drafts, context).items():
        fault = _counters_name(group, was, host_run, context)
        if fault is None:
            continue
        for draft in group:
            draft.fault, draft.view = fault, view_of(fault)
            draft.state_cause = True


def _incidents(
    drafts: Iterable[_Draft], context: RunContext
) -> dict[tuple[str | None, tuple[str, int]], list[_Draft]]:
    """The drafts that name a candidate and a fault type, grouped by that type and by where its
    cause lies: a slow link's (`LINK_FAULTS`) by engine, any other type's by the named rank."""
    groups: dict[tuple[str | None, tuple[str, int]], list[_Draft]] = {}
    for draft in drafts:
        if draft.top is None or draft.fault is None:
            continue
        if draft.fault in LINK_FAULTS:
            where = ("engine", context.engine_of.get(draft.score.iteration, 0))
        else:
            where = ("rank", draft.top.rank)
        groups.setdefault((draft.fault, where), []).append(draft)
    return groups


def _counters_name(
    group: list[_Draft], fault: str | None, host_run: bool, context: RunContext
) -> str | None:
    """The host slowdown the counters of the group's steps name together, among the readings
    that may re-type `fault` (`retyping_readings`), or None."""
    steps = [context.context(d.score, d.top, [c for c, _ in d.ranked]) for d in group]
    return pooled_fault(steps, retyping_readings(fault, host_run))


#: A rank's flagged steps of a host slowdown are a slow link's when the steps whose named
#: candidate is the rank's own collective time (a transfer, not a late arrival), holding at
#: least `TRANSFER_EXCESS` of its step's excess, hold this share of the steps' excess together.
TRANSFER_EXCESS = 0.5


def type_by_transfer(drafts: list[_Draft], context: RunContext) -> None:
    """The drafts of a host slowdown (`HOST_SLOWDOWNS`) on one rank take the link fault a
    transfer points to (the localizer's `net_throttle`) where three things hold:
    - the steps that name that rank's own collective time, holding most of their excess, hold
      most of the drafts' excess together;
    - such steps hold most of the excess of the run's host-slowdown drafts too: a peer's long
      transfer in steps where another rank stalled is the stall's, not a link's;
    - the host counters would not re-type a link fault there (`retyping_readings`: the rank's
      own CPU time rises with a slow transfer too, which keeps its thread busy). Where
      collectives run on the host (gloo) the counters must have been sampled: a rank starved of
      CPU runs its transfer threads slowly too, and only the counters tell the two apart.
    Why: a learned type head can call a rate-limited link a host stall, and the explanation
    then says the host stalled between operators while its own numbers put the step's excess
    inside one all-reduce."""
    host_run = collectives_on_host(context.tree)
    if host_run and context.host is None:
        return
    slowdowns = [d for d in drafts if d.fault in HOST_SLOWDOWNS and d.top is not None]
    if _transfer_share(slowdowns) < TRANSFER_EXCESS:
        return
    for group in _incidents(slowdowns, context).values():
        if _transfer_share(group) < TRANSFER_EXCESS:
            continue
        if context.host is not None and _counters_name(group, LINK_FAULT, host_run, context):
            continue
        for draft in group:
            draft.fault, draft.view = LINK_FAULT, view_of(LINK_FAULT)
            # a step whose excess lies elsewhere gets its measurements without the link's cause
            draft.state_cause = _excess_in_transfer(draft)


def _transfer_share(drafts: list[_Draft]) -> float:
    """The share of the drafts' summed excess held by those whose excess is their rank's own
    collective time (`_excess_in_transfer`); 0 without excess."""
    total = sum(_excess(d) for d in drafts)
    in_transfer = sum(_excess(d) for d in drafts if _excess_in_transfer(d))
    return in_transfer / total if total > 0 else 0.0


def _excess(draft: _Draft) -> float:
    """The step's time beyond what its batch predicts (0 where it took no longer)."""
    return float(max(draft.score.dur_ns - draft.score.expected_ns, 0))


def _excess_in_transfer(draft: _Draft) -> bool:
    """Whether the named candidate is its rank's own collective time and the step's
    collectives (each last arriver's own transfer time once) grew by `TRANSFER_EXCESS` of the
    step's excess together. Why together: a rate-limited link stretches every large transfer
    of the step, so one all-reduce may hold only half of it; and over every last arriver, since
    at a slow link's collectives which end arrives last is a coin toss (measured on the lab's
    TP2 rate limits: each end was last at about half of a step's all-reduces, so the named
    end's own share held half the step's excess)."""
    top, excess = draft.top, _excess(draft)
    if top is None or top.kind != "transfer" or excess <= 0:
        return False
    grown = {
        (c.rank, c.node): c.observed_ns - c.normal_ns
        for c, _ in draft.ranked
        if c.kind == "transfer"
    }
    return sum(max(g, 0) for g in grown.values()) >= TRANSFER_EXCESS * excess


def collectives_on_host(tree: CallTree) -> bool:
    """Whether the run's collectives ran on the host (gloo: none on a GPU stream), where a rank
    starved of CPU slows its transfers as a slow link does."""
    comm = tree.comm
    return bool(len(comm)) and not (tree.stream[comm.node] >= 0).any()


def one_incident_per_cause(drafts: list[_Draft], context: RunContext) -> None:
    """In a lock-stepped group, one cause is one incident: the drafts of an engine's
    lock-stepped fault types (`LOCKSTEP_FAULTS`) that blame a rank which, in its step, waited
    for its peers longer than it was late, are re-pointed at the straggler's best candidate in
    that step, or, where it has none, at its own share of the step's collective that grew most
    (`own_share`). The fault types are pooled because the type head may call one throttled
    rank's steps a straggler in one step and CPU contention in the next, while the waiting peer
    is the same symptom in both.

    The straggler is the rank that arrives last and waits least over the engine's flagged
    steps (lateness minus wait, summed), and only a clear one (`CLEAR_STRAGGLER`) re-points
    anything: a small regression's own lateness is not told apart from noise, and the pointer's
    pick on the regressed rank stands. A rank that was itself late in a step keeps its finding
    there when that lateness (less its wait) is `OWN_LATENESS` of the step's excess. Why: a
    peer's collective is long because it waits, and under a CPU-run collective (gloo) its own
    share of the transfer waits on the straggler too, so a pointer can name the peer's
    all-reduce; it is the same cause, not a second incident."""
    by_engine: dict[int, list[_Draft]] = {}
    for draft in drafts:
        if (
            draft.top is not None
            and draft.score.kind != "unfinished"
            and draft.fault in LOCKSTEP_FAULTS
        ):
            engine = context.engine_of.get(draft.score.iteration, 0)
            by_engine.setdefault(engine, []).append(draft)
    for group in by_engine.values():
        if len({d.top.rank for d in group}) < 2:
            continue
        totals = context.lateness_and_wait([d.score.iteration for d in group])
        if not totals:
            continue
        straggler = max(totals, key=lambda r: totals[r][0] - totals[r][1])
        late, wait = totals[straggler]
        if late <= 0 or late < CLEAR_STRAGGLER * wait:
            continue  # no rank is clearly the late one
        for draft in group:
            rank = draft.top.rank
            if rank == straggler:
                continue
            late, wait = context.lateness_and_wait([draft.score.iteration]).get(rank, (0.0, 0.0))
            if late - wait >= OWN_LATENESS * max(draft.score.dur_ns - draft.score.expected_ns, 0):
                continue
            _point_at_rank(draft, straggler, context)


def _candidate(c: OperatorCandidate, probability: float | None = None) -> dict:
    return {
        "operator": c.operator,
        "rank": c.rank,
        "score": c.score,
        "node": c.node,
        "kind": c.kind,
        "probability": None if probability is None else round(probability, 4),
    }


def _evidence(c: OperatorCandidate) -> Evidence:
    return Evidence(
        what=f"{c.operator} on rank {c.rank} ({c.kind})",
        observed_ns=c.observed_ns,
        normal_ns=c.normal_ns,
        z=_rounded_z(c.z),
        reference=c.reference,
    )


#: What each host measure is, as an evidence line names it.
_HOST_MEASURED = {
    "throttled_ns": "CPU quota throttling",
    "stopped_ns": "time stopped",
    "run_delay_ns": "time waiting for a CPU",
    "memory_stall_ns": "memory stall time",
    "cpu_ns": "CPU time",
}


def _host_evidence(rank: int, measure: str, reading: Measured) -> Evidence:
    """The host counter behind the fault type, as one more evidence line."""
    return Evidence(
        what=f"{_HOST_MEASURED[measure]} of rank {rank} (host counters)",
        observed_ns=int(reading.observed_ns),
        normal_ns=int(reading.normal_ns),
        z=0.0,
        reference="host counters sampled by teller collect; median of the rank's normal steps",
    )


def _rounded_z(z: float) -> float:
    """JSON has no infinity: a reference with no spread scores 1e9 (docs/json-schema.md)."""
    if np.isfinite(z):
        return round(z, 2)
    return 1e9 if z > 0 else -1e9 if z < 0 else 0.0


def _step_rows(tree: CallTree, localization: Localization, flagged: set[int]) -> list[StepRow]:
    """Every (rank, step) with the localizer's expectation and z-score, marked anomalous when the
    verdict's method flagged the iteration."""
    steps = tree.steps
    by_iteration = {s.iteration: s for s in localization.steps}
    rows = []
    for k in range(len(steps)):
        score = by_iteration.get(int(steps.index[k]))
        rows.append(
            StepRow(
                rank=int(steps.rank[k]),
                step=int(steps.index[k]),
                name=steps.name[k],
                kind=steps.kind[k],
                start_ns=int(steps.start_ns[k]),
                dur_ns=int(steps.dur_ns[k]),
                expected_ns=score.expected_ns if score else 0,
                score=score.z if score else 0.0,
                anomalous=int(steps.index[k]) in flagged,
            )
        )
    return rows


def _drafts(
    tree: CallTree, localization: Localization, steps: list[StepScore] | None = None
) -> list[_Draft]:
    """One draft per anomalous step of the localizer (or per step of `steps`), worst first."""
    drafts = []
    chosen = localization.anomalous_steps() if steps is None else steps
    for step in sorted(chosen, key=lambda s: -s.z):
        candidates = localization.candidates.get(step.iteration, [])
        top = candidates[0] if candidates else None
        fault_type, view = _fault_type(tree, top)
        if step.kind == "unfinished":
            fault_type, view = "collective_hang", "H"
        drafts.append(
            _Draft(
                score=step,
                ranked=[(c, None) for c in candidates],
                fault=fault_type,
                view=view,
                state_cause=step.kind == "unfinished" or _grounded(top),
            )
        )
    return drafts


#: Log lines shown per finding, most severe and most surely placed first.
LOG_LINES_PER_FINDING = 8
_SEVERITY = {"CRITICAL": 0, "ERROR": 1, "WARNING": 2, "INFO": 3, "DEBUG": 4, "": 5}


def _attach_logs(aligned: AlignResult | None, findings: list[Finding]) -> None:
    """Each finding gets the log lines aligned to its step and the requests batched in it."""
    if aligned is None or not findings:
        return
    table = aligned.logs.table
    step = aligned.alignment.step
    confidence = aligned.alignment.confidence
    levels = table.column("level").to_pylist()
    raws = table.column("raw").to_pylist()
    ts = table.column("ts_ns").to_numpy()
    ranks = table.column("rank").to_numpy()
    memberships = aligned.requests
    lines_of, requests_of = _rows_by_value(step), _rows_by_value(memberships.step)
    for finding in findings:
        rows = lines_of(finding.step).tolist()
        rows.sort(key=lambda i: (_SEVERITY.get(levels[i] or "", 5), -confidence[i], ts[i]))
        seen: set[str] = set()  # the same line captured twice (launcher and rank log) shows once
        rows = [i for i in rows if not (raws[i] in seen or seen.add(raws[i]))]
        finding.log_lines = [
            LogLine(
                ts_ns=int(ts[i]),
                rank=int(ranks[i]) if ranks[i] >= 0 else None,
                level=levels[i] or "",
                text=raws[i],
            )
            for i in rows[:LOG_LINES_PER_FINDING]
        ]
        in_step = memberships.request[requests_of(finding.step)]
        finding.requests = sorted({memberships.requests.key[i] for i in in_step.tolist()})


def _grounded(top: OperatorCandidate | None) -> bool:
    """Whether the localizer's fault type for this candidate rests on its pattern (a late
    arrival, a slower transfer, a persistent shift), not on the layer a slower operator ran on."""
    return top is not None and top.kind in ("arrival", "transfer", "shift", "wait")


def _rows_by_value(values: np.ndarray) -> Callable[[int], np.ndarray]:
    """A lookup of the rows holding a value, ascending (what `values == v` selects), by binary
    search: one scan per finding over every log line would grow with findings times lines."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")
    ordered = values[order]

    def rows(value: int) -> np.ndarray:
        return order[np.searchsorted(ordered, value) : np.searchsorted(ordered, value, "right")]

    return rows


def _fault_type(tree: CallTree, top: OperatorCandidate | None) -> tuple[str | None, str]:
    """The taxonomy entry (DESIGN.md §4) the top candidate's pattern points to."""
    if top is None:
        return None, "V"
    if top.kind in ("arrival", "wait"):  # a wait: the straggler is a peer the trace lacks
        return "straggler", "H"
    if top.kind == "transfer":
        return LINK_FAULT, view_of(LINK_FAULT)
    layer = LAYERS[tree.layer[top.node]]
    if top.kind == "shift":  # one operator regressed on one rank, its peers unchanged
        return ("kernel_regression" if layer == "kernel" else "slow_operator"), "V"
    if layer == "runtime":
        return "host_cpu_contention", "V"
    if layer in ("kernel", "memcpy", "memset"):
        return "gpu_throttle", "V"
    if layer in ("engine", "python"):  # a frame's own time: its thread stopped between operators
        return "host_stall", "V"
    return "cpu_contention", "V"


def nothing_found(step_rank: Iterable[int], step_kind: Iterable[str], total: int) -> str:
    """What a clean verdict compared, so it claims no more than was checked: batches where an
    engine defines them, the run's other steps of a kind otherwise, and within a step its
    repeated layers and its ranks. `step_rank` and `step_kind`: per (rank, step) row."""
    noun = "step" if total == 1 else "steps"
    rank_of_row = [int(r) for r in step_rank]
    ranks = len(set(rank_of_row))
    peers = " or against the other ranks" if ranks > 1 else ""
    per_rank = len(rank_of_row) // max(ranks, 1)
    if per_rank < 2:  # one step has no batch model and no other step to compare with
        said = f"no operator stands out against the step's repeated layers{peers}"
        where = "the one step captured" + (" per rank" if ranks > 1 else "")
        return f"No anomalous step in {where}: {said}."
    if set(step_kind) <= BATCHED_STEP_KINDS:
        said = "every step took what its batch predicts"
    else:
        said = "every step took about what the run's other steps of its kind took"
    return f"No anomalous step among {total} {noun}: {said}, and no operator stands out."


def summary_of(findings: list[Finding], total: int, clean: Callable[[], str]) -> str:
    """The lines a person reads first, over `total` steps; `clean()` where nothing was found."""
    if not total:
        return "No engine steps found: pass --step-regex naming the engine's step annotation."
    if not findings:
        return clean()
    flagged = [f.step for f in findings]
    verb = "step is" if len(findings) == 1 and total == 1 else "steps are"
    if len(findings) == 1 and total > 1:
        verb = "steps is"
    noun = "step" if len(set(flagged)) == 1 else "steps"
    lines = [f"{len(findings)} of {total} {verb} anomalous ({noun} {step_ranges(flagged)})."]
    for group in incidents(findings)[:SUMMARY_FINDINGS]:
        worst = worst_of(group)
        kinds = Counter(f.fault_type for f in group if f.fault_type)
        pattern = _pattern(kinds, len(group))
        where = f" in {len(group)} of them" if len(findings) > 1 else ""
        if engine_wide(kinds):  # a capped scheduler: no rank or operator is to blame
            lines.append(
                f"Suspect the engine's scheduling{where}{pattern}: no single rank or operator."
                f" Worst: {worst.explanation}"
            )
            continue
        who = blamed_ranks(group) or "no single rank"
        operators = Counter(f.operator for f in group if f.operator)
        ops = ", ".join(short_name(op, 50) for op, _ in operators.most_common(2))
        lines.append(
            f"Suspect {who}{where}{pattern}"
            + (f"; {'operators' if len(operators) > 1 else 'operator'}: {ops}." if ops else ".")
            + f" Worst: {worst.explanation}"
        )
    return "\n".join(lines)


def _pattern(kinds: Counter, findings: int) -> str:
    """The fault types of an incident as its summary line names them: "mostly" only for a type
    that more than half its findings carry, else the two most common."""
    if not kinds:
        return ""
    top, count = kinds.most_common(1)[0]
    if count == findings:
        return f", {top}"
    if 2 * count > findings:
        return f", mostly {top}"
    return ", " + " or ".join(kind for kind, _ in kinds.most_common(2))


#: Flagged steps of one rank at most this many steps apart belong to one incident.
INCIDENT_GAP = 3


def by_incident(findings: list[Finding]) -> list[Finding]:
    """Findings reordered: a step a hang left unfinished first, then the longest incident, worst
    step first within it.

    A fault lasts: it slows a run of steps on one rank. Load noise on a shared host slows a step
    here and there, sometimes by more than the fault does. So the headline is the worst step of
    the incident (a run of flagged steps blaming one rank, gaps of at most `INCIDENT_GAP` steps)
    with the most steps, ties broken by the time its steps lost. Within an incident, the steps that
    blame its most blamed operator come first (a slow step under load can put another operator on
    top of one step while the regressed one leads the run), each part in the incoming order."""
    hung = [f for f in findings if f.step_kind == "unfinished"]
    findings = [f for f in findings if f.step_kind != "unfinished"]
    runs: list[list[Finding]] = []
    for rank in dict.fromkeys(f.rank for f in findings):
        mine = sorted((f for f in findings if f.rank == rank), key=lambda f: f.step)
        for finding in mine:
            if (
                runs
                and runs[-1][0].rank == rank
                and finding.step - runs[-1][-1].step <= INCIDENT_GAP
            ):
                runs[-1].append(finding)
            else:
                runs.append([finding])
    position = {id(f): i for i, f in enumerate(findings)}

    def strength(run: list[Finding]) -> tuple[int, int]:
        lost = sum(max(f.step_dur_ns - f.step_expected_ns, 0) for f in run)
        return len(run), lost

    def inside(run: list[Finding]) -> list[Finding]:
        blamed = Counter(f.operator for f in run if f.operator).most_common(1)
        lead = blamed[0][0] if blamed else None
        return sorted(run, key=lambda f: (f.operator != lead, position[id(f)]))

    ordered = sorted(runs, key=lambda run: tuple(-v for v in strength(run)))
    return hung + [f for run in ordered for f in inside(run)]


def worst_of(group: list[Finding]) -> Finding:
    """The finding whose step lost the most time against what its batch predicts (a step a
    hang left unfinished first); the first of equals."""
    return max(
        group, key=lambda f: (f.step_kind == "unfinished", f.step_dur_ns - f.step_expected_ns)
    )


def headline_finding(findings: list[Finding]) -> Finding | None:
    """The worst finding of the first incident: the one the summary's first "Worst:" names and
    the reports draw the tree, breakdown and Gantt chart of (None without findings)."""
    return worst_of(incidents(findings)[0]) if findings else None


def incidents(findings: list[Finding]) -> list[list[Finding]]:
    """Findings grouped by the rank they blame, worst first (findings arrive worst first): a
    fault window covers many steps whose top operator can differ when a whole rank slowed.
    Findings of a fault of the whole engine (`teller.faults.ENGINE_WIDE_FAULTS`) are one group
    whatever rank their measurements came from: no rank is to blame. Findings of a slow link
    whose ends the trace cannot tell apart are one group over those ranks: each step names the
    end its own measurements lean to, and a window of them would otherwise read as several
    incidents on different ranks for one link."""
    links: dict[tuple[str | None, int], tuple[int, ...]] = {}
    for f in findings:
        if f.alike_ranks and f.rank is not None:
            ends = _alike_key(f)
            links.update(((f.fault_type, rank), ends) for rank in ends)
    groups: dict[int | str | tuple[int, ...] | None, list[Finding]] = {}
    for finding in findings:
        groups.setdefault(_incident_key(finding, links), []).append(finding)
    return list(groups.values())


def _alike_key(finding: Finding) -> tuple[int, ...]:
    assert finding.rank is not None
    return tuple(sorted({finding.rank, *finding.alike_ranks}))


def _incident_key(
    finding: Finding, links: dict[tuple[str | None, int], tuple[int, ...]]
) -> int | str | tuple[int, ...] | None:
    """What an incident blames: the engine, a set of ranks the trace cannot tell apart (a slow
    link's ends, `Finding.alike_ranks`), or one rank. `links`: (fault type, rank) → the set of
    ranks a finding of that type could not tell apart; a step of that type on one of them
    whose own excess lay elsewhere (it names no link end) belongs to the same incident."""
    if finding.fault_type in ENGINE_WIDE_FAULTS:
        return "engine"
    if finding.alike_ranks and finding.rank is not None:
        return _alike_key(finding)
    return links.get((finding.fault_type, finding.rank), finding.rank)


def blamed_ranks(group: list[Finding]) -> str:
    """The ranks an incident names: "rank 3", or "rank 0, 1 or 2" where the trace cannot tell
    the link's ends apart, or "" where no finding names one."""
    ranks = sorted({r for f in group if f.rank is not None for r in (f.rank, *f.alike_ranks)})
    if not ranks:
        return ""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"rank {', '.join(map(str, ranks[:-1]))} or {ranks[-1]} (their link times are alike)"


def step_ranges(steps: list[int]) -> str:
    """[3, 4, 5, 9] → "3–5, 9"."""
    ordered = sorted(set(steps))
    ranges: list[str] = []
    start = previous = ordered[0]
    for step in [*ordered[1:], None]:
        if step is not None and step == previous + 1:
            previous = step
            continue
        ranges.append(f"{start}" if start == previous else f"{start}–{previous}")
        if step is not None:
            start = previous = step
    return ", ".join(ranges)


def missing_inputs(inputs: RunInputs) -> list[str]:
    missing = []
    if not inputs.log_files:
        missing.append(
            "no engine logs: log evidence (preemptions, watchdog timeouts, JIT warnings) and "
            "request ids are unavailable; verdicts rest on the traces alone"
        )
    if not inputs.otlp_files:
        missing.append("no OpenTelemetry spans: per-request TTFT and queueing are unavailable")
    if len(inputs.ranks) < 2:
        missing.append(
            "one rank only: cross-rank (horizontal) faults such as stragglers cannot be told apart"
        )
    return missing
