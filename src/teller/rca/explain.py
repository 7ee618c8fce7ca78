"""One flagged step's explanation, composed from sentence plans and the step's measured facts.

The order is fixed (`teller.rca.plans.FAMILIES`): what was observed, the pointed node's evidence,
the mechanism, the fault type's cause, the share of the step's excess the evidence explains (and
where the rest went when that is under a third), how long the named rank's GPU sat idle in the
step and what its host was doing meanwhile (`teller.callchain.breakdown`), and what the trace
cannot tell. Which plan of each family is used follows from the facts (a one-rank trace never
gets a sentence about peers; a step no slower than its batch predicts gets no share; a GPU busy
nearly throughout gets no idle time), except the mechanism, which the root-cause model's
explanation head chooses (`mechanism=`) among those its facts allow; the localizer, which has no
such head, states its fault type's first mechanism the facts allow (`default_mechanism`).

Every slot is a measured fact of `StepContext`; nothing is generated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from teller.callchain.steps import BATCHED_STEP_KINDS
from teller.faults import FAULT_FREE
from teller.localize import FRESH, NEW_OPERATOR, SUBSTITUTED
from teller.localize.collectives import OWN_SHARE_REFERENCE
from teller.rca.context import StepContext
from teller.rca.host import LINK_FAULTS, stated_reading
from teller.rca.plans import BASIS_BATCH, BASIS_RUN, MECHANISMS, PLANS, Collectives, render

#: Under this share of the step's excess, the evidence is said to explain little, and the
#: explanation says where the rest went.
SMALL_SHARE = 1 / 3
#: Late arrivals or a mechanism's rise over this many times the step's excess are said to exceed
#: it, not to be all of it: the step's other work took that much less than expected, or the rise
#: overlapped it.
BEYOND_EXCESS = 1.5
#: A candidate named as where the rest went must take at least this share of the step's excess.
REST_SHARE = 0.1
#: A mechanism is stated only where its measure moved: at least this far above (or, for a
#: batch, below) its normal.
MECHANISM_RISE = 1.1
#: A late arrival this much beyond the rank's usual is still the group's skew, not a mechanism.
MIN_LATE_NS = 20_000.0
#: The named rank's GPU idle time is stated only where it is at least this share of its step's
#: span. Below it the GPU was busy nearly throughout: launch latency between back-to-back
#: kernels and the step's edges leave a few percent idle in any step, and a sentence about them
#: would tell nothing about why this one was slow.
IDLE_STATED = 0.1

#: Fault type → the mechanisms a person would state for it, most telling first. The model's
#: explanation head chooses among them (and "none"); the localizer takes the first one the facts
#: allow. Its training target is that same first one (`teller.rca.dataset.targets`).
FAULT_MECHANISMS: dict[str, tuple[str, ...]] = {
    "straggler": ("late_arrival", "host_slower", "gpu_slower"),
    "cpu_contention": ("host_slower", "late_arrival"),
    "host_stall": ("launch_gaps", "late_arrival", "host_slower"),
    "memory_pressure": ("host_slower", "late_arrival"),
    "slow_operator": ("late_arrival",),
    "kernel_regression": ("gpu_slower", "late_arrival"),
    "gpu_throttle": ("gpu_slower", "late_arrival"),
    "gpu_contention": ("gpu_slower", "late_arrival"),
    "host_cpu_contention": ("launch_gaps", "host_slower", "late_arrival"),
    "kv_pressure": ("recompute", "gpu_slower"),
    "scheduler_misconfig": ("small_batches",),
    "net_delay": ("transfer_slower",),
    "bandwidth_throttle": ("transfer_slower",),
    "net_throttle": ("transfer_slower",),
    "link_contention": ("transfer_slower",),
    "collective_hang": (),
}
#: Fault type → what the trace cannot tell about it.
CAVEATS: dict[str, str] = {
    "straggler": "caveat.cpu",
    "cpu_contention": "caveat.cpu",
    "host_cpu_contention": "caveat.cpu",
    "host_stall": "caveat.stall",
    "memory_pressure": "caveat.memory",
    "gpu_throttle": "caveat.gpu",
    "gpu_contention": "caveat.gpu",
    "slow_operator": "caveat.kernel",
    "kernel_regression": "caveat.kernel",
    "net_delay": "caveat.link",
    "bandwidth_throttle": "caveat.link",
    "net_throttle": "caveat.link",
    "link_contention": "caveat.link",
}
#: The caveats that say the trace has no host metrics.
_HOST_CAVEATS = frozenset({"caveat.cpu", "caveat.stall", "caveat.memory"})
#: Faults whose cause sentence says the peers waited: a one-rank trace gets the `_alone` plan.
_ALONE = {"straggler", "cpu_contention", "host_stall", "slow_operator"}
#: Link faults whose cause sentence quotes the collectives' excess by size (`_link_sized`).
_SIZED_LINK_FAULTS = frozenset({"net_delay", "bandwidth_throttle", "net_throttle"})
#: Faults the logs confirm (preemptions, the request queue).
_LOGGED = {"kv_pressure", "scheduler_misconfig"}
_SHIFTED_FOR = re.compile(r"shifted for (\d+) steps")
_LAYER_OF = re.compile(r"this is layer (\d+) of (\d+)")
_SAME_FRAME = re.compile(r"^same frame \(call \d+\), its own time, in the run's other")
_LAUNCHED_BY = re.compile(
    r"^same launch \(kernel \d+ of call \d+ to (.+)\) (in the run's|on the) other"
)


@dataclass(frozen=True)
class Sentence:
    plan: str
    text: str


@dataclass(frozen=True)
class Explanation:
    """The sentences of one explanation, with the excess its named evidence accounts for."""

    sentences: tuple[Sentence, ...]
    explained_ns: float  # the excess of everything it names (the evidence, the rest's operator)
    excess_ns: float  # the step's excess on the named rank

    @property
    def text(self) -> str:
        return " ".join(s.text for s in self.sentences)

    @property
    def plans(self) -> tuple[str, ...]:
        return tuple(s.plan for s in self.sentences)


def available_mechanisms(context: StepContext) -> list[str]:
    """The mechanisms whose facts the step holds and whose measure moved."""
    found = ["none"]
    if context.unfinished:
        return found
    late = context.arrivals
    if (
        late is not None
        and context.rank is not None
        and not context.one_rank
        and late.late_ns > MECHANISM_RISE * late.usual_late_ns
        and late.late_ns - late.usual_late_ns >= MIN_LATE_NS
    ):
        found.append("late_arrival")
    per_rank = context.rank is not None  # a rank's own work needs a rank to name
    for name, measured in (
        ("host_slower", context.host if per_rank else None),
        ("gpu_slower", context.gpu if per_rank else None),
        ("launch_gaps", context.idle if per_rank else None),
        ("transfer_slower", context.transfer),
    ):
        if measured is not None and measured.observed_ns > MECHANISM_RISE * measured.normal_ns:
            found.append(name)
    if context.context_tokens is not None:
        now, usual = context.context_tokens
        if now > MECHANISM_RISE * usual and now > 0:
            found.append("recompute")
    if context.batch_tokens is not None:
        now, largest = context.batch_tokens
        if 0 < now * MECHANISM_RISE < largest:
            found.append("small_batches")
    return [m for m in MECHANISMS if m in found]


def allowed_mechanisms(context: StepContext, fault: str | None) -> list[str]:
    """What the explanation head may choose for this step: "none", and the fault type's
    mechanisms whose facts the step holds."""
    available = set(available_mechanisms(context))
    return ["none", *(m for m in FAULT_MECHANISMS.get(fault or "", ()) if m in available)]


def default_mechanism(context: StepContext, fault: str | None) -> str:
    """The fault type's first mechanism the facts allow ("none" without one)."""
    allowed = allowed_mechanisms(context, fault)
    return allowed[1] if len(allowed) > 1 else "none"


def choose_mechanism(
    context: StepContext, fault: str | None, scores: Sequence[float] | None
) -> str:
    """The explanation head's choice (`scores`: one per `MECHANISMS`) among the allowed
    mechanisms; the default without scores."""
    if scores is None:
        return default_mechanism(context, fault)
    allowed = allowed_mechanisms(context, fault)
    return max(allowed, key=lambda m: scores[MECHANISMS.index(m)])


def compose(
    context: StepContext,
    fault: str | None,
    mechanism: str | None = None,
    state_cause: bool = True,
) -> Explanation:
    """The explanation of one step: `fault` is the fault head's (or the localizer's) type,
    `mechanism` the head's choice (None: `default_mechanism`). Without `state_cause` the fault
    type's own sentences (its cause and caveat) are left out: the localizer's type for an
    operator that is merely slower is a guess from the layer it ran on, not evidence. Where the
    rank arrived late at the step's collectives and the mechanism is another one (its host or
    GPU time), the late arrival is stated after it: that is what the rank cost its peers."""
    if fault in FAULT_FREE:
        fault = None
    if mechanism is None:
        mechanism = default_mechanism(context, fault)
    if mechanism not in allowed_mechanisms(context, fault):
        raise ValueError(f"mechanism {mechanism!r} is not allowed for this step ({fault})")
    said: list[tuple[str, dict]] = []
    c = context
    top = c.candidate
    if c.unfinished and top is not None:
        said.append(
            (
                "observed.hang",
                dict(step=c.iteration, rank=top.rank, op=top.operator, waited=c.step_dur_ns),
            )
        )
        if fault is not None:
            said += _cause(c, fault)
        return _explanation(said, 0.0, 0.0)
    # the observed sentence: the step, its kind, and what its time was expected from
    step = dict(
        step=c.iteration,
        kind=c.kind.replace("_", " "),
        basis=BASIS_BATCH if c.kind in BATCHED_STEP_KINDS else BASIS_RUN,
    )
    slower = c.rank_dur_ns > c.expected_ns
    if top is None:
        said.append(("observed.no_rank", dict(step, dur=c.step_dur_ns, expected=c.expected_ns)))
        said.append(("evidence.none", {}))
    elif slower:
        said.append(
            (
                "observed.slow",
                dict(step, dur=c.rank_dur_ns, rank=top.rank, expected=c.expected_ns),
            )
        )
    elif c.only_step:
        only = dict(step=c.iteration, kind=step["kind"], dur=c.rank_dur_ns, rank=top.rank)
        said.append(("observed.only", only))
    else:
        said.append(("observed.within", dict(step, dur=c.rank_dur_ns, rank=top.rank)))
    named = 0.0
    if top is not None:
        evidence, named = _evidence(c)
        said.append(evidence)
    said += _mechanism(c, mechanism)
    if mechanism != "late_arrival" and "late_arrival" in allowed_mechanisms(c, fault):
        # what the rank's own work did is the mechanism; its peers' waiting is what it cost them
        said += _mechanism(c, "late_arrival")
    said += _host(c, fault)
    if fault is not None and state_cause:
        said += _cause(c, fault)
    explained = 0.0
    excess = c.excess_ns
    if top is not None and slower and c.excess_ns > 0:
        share_said, explained, excess = _share(c, named, mechanism)
        said.append(share_said)
    said += _time(c)
    said += _caveats(c, fault, state_cause)
    return _explanation(said, explained, excess)


def _explanation(said: list[tuple[str, dict]], explained: float, excess: float) -> Explanation:
    return Explanation(
        tuple(Sentence(plan, render(plan, **facts)) for plan, facts in said),
        explained_ns=explained,
        excess_ns=excess,
    )


def _evidence(c: StepContext) -> tuple[tuple[str, dict], float]:
    """The pointed node's sentence, and its excess over its normal."""
    top = c.candidate
    assert top is not None
    base = dict(rank=top.rank, op=top.operator, observed=top.observed_ns)
    excess = float(max(top.observed_ns - top.normal_ns, 0))
    with_normal = dict(base, normal=top.normal_ns)
    if top.kind == "arrival":
        if _evidence_on_time(c):
            return ("evidence.arrival_first", base), excess
        return ("evidence.arrival", with_normal), excess
    if top.kind == "transfer":
        if top.reference == OWN_SHARE_REFERENCE:
            return ("evidence.own_share", with_normal), excess
        return ("evidence.transfer", with_normal), excess
    if top.kind == "wait":
        return ("evidence.wait", with_normal), excess
    if top.kind == "idle":
        return ("evidence.idle", with_normal), excess
    if top.kind == "forward":
        return ("evidence.forward", with_normal), excess
    if top.kind == "shift":
        shifted = _SHIFTED_FOR.search(top.reference)
        if shifted:
            return ("evidence.shift", dict(with_normal, steps=int(shifted.group(1)))), excess
        return ("evidence.peers", with_normal), excess
    if top.reference == NEW_OPERATOR:
        return ("evidence.new_operator", base), float(top.observed_ns)
    if top.reference == SUBSTITUTED:
        return ("evidence.substituted", base), float(top.observed_ns)
    layer = _LAYER_OF.search(top.reference)
    if layer:
        where = dict(with_normal, layer=int(layer.group(1)), layers=int(layer.group(2)))
        return ("evidence.layer", where), excess
    if top.reference.startswith("same operator on peer ranks"):
        return ("evidence.peers", with_normal), excess
    if _SAME_FRAME.search(top.reference):
        return ("evidence.frame", with_normal), excess
    launched = _LAUNCHED_BY.search(top.reference)
    if launched:
        plan = "evidence.repeat" if launched.group(2) == "in the run's" else "evidence.repeat_peers"
        return (plan, dict(with_normal, other_op=launched.group(1))), excess
    if c.peers_ns is not None and c.peer_rank is not None:
        return (
            "evidence.temporal_peer",
            dict(with_normal, peers=c.peers_ns, peer_rank=c.peer_rank),
        ), excess
    if c.peers_ns is not None:
        return ("evidence.temporal_peers", dict(with_normal, peers=c.peers_ns)), excess
    return ("evidence.temporal", with_normal), excess


def _evidence_on_time(c: StepContext) -> bool:
    """Whether the pointed node's sentence says its rank is usually on time at the collective
    (`evidence.arrival_first`): a late arrival where the reference steps had none."""
    top = c.candidate
    return top is not None and top.kind == "arrival" and top.normal_ns <= 0


def _mechanism(c: StepContext, mechanism: str) -> list[tuple[str, dict]]:
    if mechanism == "none":
        return []
    plan = f"mechanism.{mechanism}"
    if mechanism == "late_arrival":
        late = c.arrivals
        assert late is not None
        collectives = Collectives(late.count, late.kind, late.size_bytes, late.largest_bytes)
        facts = dict(
            rank=c.rank,
            late=late.late_ns,
            collectives=str(collectives),
            waited=late.waited_ns,
            own=late.own_ns,
        )
        if late.usual_late_ns <= 0:
            # said once: the evidence sentence may already say the rank is usually on time
            top = c.candidate
            said = _evidence_on_time(c) and top is not None and top.rank == c.rank
            return [(f"{plan}_first_said" if said else f"{plan}_first", facts)]
        return [(plan, dict(facts, normal=late.usual_late_ns))]
    measured = {
        "host_slower": c.host,
        "gpu_slower": c.gpu,
        "launch_gaps": c.idle,
        "transfer_slower": c.transfer,
    }.get(mechanism)
    if measured is not None:
        facts = dict(observed=measured.observed_ns, normal=measured.normal_ns)
        if mechanism != "transfer_slower":
            facts["rank"] = c.rank
        return [(plan, facts)]
    if mechanism == "recompute":
        assert c.context_tokens is not None
        return [(plan, dict(tokens=c.context_tokens[0], normal_tokens=c.context_tokens[1]))]
    assert mechanism == "small_batches" and c.batch_tokens is not None
    facts = dict(tokens=c.batch_tokens[0], largest_tokens=c.batch_tokens[1])
    if c.held_back:
        return [(f"{plan}_queued", dict(facts, held_back=c.held_back))]
    return [(plan, facts)]


def _cause(c: StepContext, fault: str) -> list[tuple[str, dict]]:
    plan = f"cause.{fault}"
    if _waited(c):
        plan = "cause.peer_wait"
    elif fault in _ALONE and c.one_rank:
        plan += "_alone"
    elif fault == "straggler" and _named_by_own_share(c):
        return [("cause.straggler_share", dict(rank=c.rank))]
    elif fault == "straggler" and (own_time := _own_time_plan(c)) is not None:
        assert c.arrivals is not None
        return [(own_time, dict(rank=c.rank, own=c.arrivals.own_ns, late=c.arrivals.late_ns))]
    if plan == "cause.kv_pressure" and c.preempted:
        return [("cause.kv_pressure_logged", dict(preempted=c.preempted))]
    sized = _link_sized(c, fault)
    if plan == f"cause.{fault}" and sized is not None:
        return [sized]
    if plan not in PLANS:
        return []
    needs_rank = "rank" in PLANS[plan].slots
    if needs_rank and c.rank is None:
        return []
    return [(plan, dict(rank=c.rank) if needs_rank else {})]


#: A link's end stands out where its own collective time in the step is at least this many
#: times its peers' median: every member of a collective waits for its slowest link, so alike
#: times (a gloo ring's, measured on the lab's TP3 runs) leave the end unnamed by the trace.
LINK_END_STANDS_OUT = 1.5


def _transfers_alike(c: StepContext) -> bool:
    """Whether the named rank's own collective time in the step is within
    `LINK_END_STANDS_OUT` of its peers' (the trace then cannot tell which end's link it is)."""
    if c.rank is None or c.rank_transfers is None:
        return False
    own, peers = c.rank_transfers
    return own < LINK_END_STANDS_OUT * peers


def _link_sized(c: StepContext, fault: str) -> tuple[str, dict] | None:
    """A slow link's cause with its collectives' measured excess by size, where that
    measurement (`StepContext.link_growth`) agrees with the type: a delay costs every message
    about the same, a rate limit more the larger the message. None otherwise, and the cause is
    stated without numbers."""
    growth = c.link_growth
    if growth is None or c.rank is None or fault not in _SIZED_LINK_FAULTS:
        return None
    if growth.grows != (fault != "net_delay"):
        return None
    return (
        f"cause.{fault}_sized",
        dict(
            rank=c.rank,
            large_sizes=growth.large_range,
            large_excess=growth.large_excess_ns,
            small_sizes=growth.small_range,
            small_excess=growth.small_excess_ns,
        ),
    )


def _named_by_own_share(c: StepContext) -> bool:
    """Whether the rank is named by its own share of a collective it did not reach late."""
    top = c.candidate
    return top is not None and top.reference == OWN_SHARE_REFERENCE


def _own_time_plan(c: StepContext) -> str | None:
    """The straggler's sentence when the rank spent longer inside the collectives it reached
    late than it was late, so "not transfer" beside that time would read as a contradiction;
    None otherwise. With host counters that show the rank held off a CPU, the time was held back
    with it (gloo's transfer runs on its CPU too): `cause.straggler_held`. Without them, in a
    step whose transfer rose, its peers' time there is not all waiting for it and a throttled
    link from it would read the same: `cause.straggler_or_link`."""
    late = c.arrivals
    if late is None or c.rank is None or late.own_ns <= late.late_ns:
        return None
    if stated_reading(c, "straggler") is not None:
        return "cause.straggler_held"
    if c.transfer is not None and c.transfer.observed_ns > MECHANISM_RISE * c.transfer.normal_ns:
        return "cause.straggler_or_link"
    return None


def _share(c: StepContext, named: float, mechanism: str) -> tuple[tuple[str, dict], float, float]:
    """How much of the step's excess the evidence accounts for (the sentence, the time it
    explains and the excess it is a share of), and where the rest went: the mechanism's rise
    (late arrivals beyond the rank's usual, its host or GPU time, idle or transfer beyond
    normal) where it exceeds the pointed node's excess, else the pointed node's; when the
    pointed node's own excess is under `SMALL_SHARE`, the other candidate that took most.

    A straggler's late arrivals cost its peers, who wait for it, more than its own step: its
    step ends when its last collective does, and it waited at none. Where they exceed its own
    excess, they are a share of the step's excess on the peers (the slowest rank's time)."""
    rise, plan = _mechanism_rise(c, mechanism)
    peers_excess = float(max(c.step_dur_ns - c.expected_ns, 0))
    if plan == "share.late" and rise > c.excess_ns and peers_excess > c.excess_ns:
        facts = dict(named=rise, share=rise / peers_excess, excess=peers_excess)
        beyond = "_beyond" if rise > BEYOND_EXCESS * peers_excess else ""
        return (f"share.late_peers{beyond}", facts), min(rise, peers_excess), peers_excess
    excess = c.excess_ns
    rest = _largest_other(c) if named < SMALL_SHARE * excess else None
    rest_facts = {}
    rest_excess = 0.0
    if rest is not None:
        rest_excess = float(max(rest.observed_ns - rest.normal_ns, 0))
        rest_facts = dict(
            other_op=rest.operator,
            other_rank=rest.rank,
            other_observed=rest.observed_ns,
            other_normal=rest.normal_ns,
        )
    if rise > named:
        facts = dict(named=rise, share=rise / excess, excess=excess)
        if rest is not None:
            return (f"{plan}_rest_operator", dict(facts, **rest_facts)), min(rise, excess), excess
        if rise > BEYOND_EXCESS * excess:
            plan = f"{plan}_beyond"  # share.late_beyond, share.rise_beyond
        return (plan, facts), min(rise, excess), excess
    share = named / excess
    top = c.candidate
    assert top is not None
    facts = dict(op=top.operator, rank=top.rank, named=named, share=share, excess=excess)
    if share >= SMALL_SHARE:
        return ("share.excess", facts), min(named, excess), excess
    if rest is not None:
        explained = min(named + rest_excess, excess)
        return ("share.rest_operator", dict(facts, **rest_facts)), explained, excess
    return ("share.rest_none", dict(facts, rest=excess - named)), named, excess


def _mechanism_rise(c: StepContext, mechanism: str) -> tuple[float, str]:
    """The stated mechanism's measure beyond its normal, and the share plan that says it."""
    if mechanism == "late_arrival" and c.arrivals is not None:
        return c.arrivals.late_ns - c.arrivals.usual_late_ns, "share.late"
    measured = {
        "host_slower": c.host,
        "gpu_slower": c.gpu,
        "launch_gaps": c.idle,
        "transfer_slower": c.transfer,
    }.get(mechanism)
    if measured is None:
        return 0.0, "share.rise"
    return measured.excess_ns, "share.rise"


def _time(c: StepContext) -> list[tuple[str, dict]]:
    """How long the named rank's GPU sat idle in the step, and its largest idle contributor: what
    the host was doing meanwhile (`teller.callchain.breakdown`). Stated only for the rank the
    explanation names (a step without a candidate names none) and where the idle time is
    `IDLE_STATED` of the step or more."""
    b = c.breakdown
    if b is None or c.candidate is None or c.rank is None or b.span_ns <= 0:
        return []
    if b.idle_ns < IDLE_STATED * b.span_ns:
        return []
    facts: dict[str, object] = dict(rank=c.rank, step=c.iteration, idle_share=b.idle_ns / b.span_ns)
    if not b.idle_contributors:
        return [("time.idle", facts)]
    top = b.idle_contributors[0]
    facts["cause_share"] = top.idle_ns / b.idle_ns
    plan = f"time.idle_{top.cause}"
    if top.cause not in ("sync", "launch"):
        return [(plan, facts)]
    if top.host_call is None:
        return [(f"{plan}_unnamed", facts)]
    facts["host_call"] = top.host_call
    if top.cpu_operator is None:
        return [(f"{plan}_call", facts)]
    return [(plan, dict(facts, host_op=top.cpu_operator))]


def _largest_other(c: StepContext):
    """The step's other candidate with the largest excess, where it takes `REST_SHARE` of the
    step's excess; on the named rank first (its time is that rank's), else any rank."""

    def excess(candidate) -> float:
        if candidate.reference in FRESH:
            return float(candidate.observed_ns)
        return float(candidate.observed_ns - candidate.normal_ns)

    top = c.candidate
    others = [
        o
        for o in c.others
        if o.kind != "forward"
        and (top is None or (o.operator, o.rank) != (top.operator, top.rank))
        and excess(o) >= REST_SHARE * c.excess_ns
    ]
    if not others:
        return None
    same_rank = [o for o in others if top is not None and o.rank == top.rank]
    return max(same_rank or others, key=excess)


def _host(c: StepContext, fault: str | None) -> list[tuple[str, dict]]:
    """The host counter that shows the stated host slowdown in this step, where it rose."""
    stated = stated_reading(c, fault)
    if stated is None or c.rank is None:
        return []
    measure, reading = stated
    if measure == "major_faults":
        counts = dict(faults=reading.observed_ns, normal_faults=reading.normal_ns)
        return [(f"host.{measure}", dict(counts, rank=c.rank))]
    times = dict(observed=reading.observed_ns, normal=reading.normal_ns)
    return [(f"host.{measure}", dict(times, rank=c.rank))]


def _waited(c: StepContext) -> bool:
    """Whether the step's finding is a collective that waited for peers the trace lacks."""
    return c.candidate is not None and c.candidate.kind == "wait"


def _first_call(c: StepContext) -> bool:
    """Whether a one-step capture's finding is an operator's first layer against its later
    ones: in the only step there is no earlier step to have paid for the first calls' set-up."""
    if not c.only_step or c.candidate is None:
        return False
    layer = _LAYER_OF.search(c.candidate.reference)
    return layer is not None and layer.group(1) == "1"


def _caveats(c: StepContext, fault: str | None, state_cause: bool) -> list[tuple[str, dict]]:
    if _waited(c):
        return [("caveat.peer_wait", {})]
    out = []
    if c.first_step and fault is not None:
        out.append(("caveat.first_step", {"step": c.iteration}))
    elif _first_call(c):
        out.append(("caveat.first_call", {}))
    # "no host metrics" is false where the counters were sampled
    measured = c.host_counters is not None and CAVEATS.get(fault) in _HOST_CAVEATS
    if fault in CAVEATS and state_cause and not measured:
        out.append((CAVEATS[fault], {}))
    if fault in LINK_FAULTS and state_cause and c.ranks == 2:
        out.append(("caveat.link_ends", {}))
    elif fault in LINK_FAULTS and state_cause and _transfers_alike(c):
        assert c.rank_transfers is not None
        own, peers = c.rank_transfers
        out.append(("caveat.link_alike", dict(rank=c.rank, own=own, peers=peers)))
    if fault in _LOGGED and not c.has_logs:
        out.append(("caveat.no_logs", {}))
    if c.one_rank and c.rank is not None and fault is not None:
        out.append(("caveat.one_rank", {}))
    return out
