"""Sentence plans: every sentence an explanation can hold, as a grammatical template with typed slots.

An explanation is a few sentences in a fixed order of families: what was observed (the step and
its time), the evidence (the pointed node against its normal), the mechanism (what the rank's work
did: a late arrival with its peers waiting, host operators stretched, a GPU idle for launches...),
the cause (the fault type's own sentence), the share of the step's excess that the evidence
explains (and where the rest went when that is under a third), how long the named rank's GPU sat
idle in the step and what its host was doing meanwhile, and what the trace cannot tell.

Why templates and not free words: a template is grammatical once, for every value its slots take,
and each slot takes only a measured fact (a duration, a rank, an operator name, a count with the
noun it agrees with). `render` writes a sentence from a plan and its facts; `parse` reads a text
back into plans and slot values, or says it does not parse, which is what the scoreboard's
well-formedness and agreement figures check. docs/explanations.md lists every plan with an example
(`tests/rca/test_plans.py` keeps the two in step).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from teller.callchain.breakdown import share as percentage
from teller.callchain.render import format_ns, short_name

#: Families in the order their sentences appear; an explanation holds at most one sentence of
#: each, but for what the trace cannot tell and for the mechanism (its own work, then the late
#: arrival it cost its peers) (`REPEATED`).
FAMILIES = ("observed", "evidence", "mechanism", "host", "cause", "share", "time", "caveat")
REPEATED = frozenset({"caveat", "mechanism"})
#: Longest operator name an explanation shows (kernel names run to kilobytes of templates).
OPERATOR_CHARS = 90

_DURATION = r"\d+(?:\.\d+)? (?:ns|µs|ms|s)"
_COUNT_WORDS = r"(?:1 {noun}|(?:0|[2-9]|\d{{2,}}) {noun}s)"
#: How a collective's kind reads in a sentence (`CommInstances.kind`, lower-cased, no separators).
COLLECTIVE_WORDS = {
    "allreduce": "all-reduce",
    "allgather": "all-gather",
    "reducescatter": "reduce-scatter",
    "broadcast": "broadcast",
    "alltoall": "all-to-all",
    "reduce": "reduce",
    "barrier": "barrier",
    "send": "send",
    "recv": "receive",
    "gather": "gather",
    "scatter": "scatter",
}
_COLLECTIVE = (
    "(?:" + "|".join(re.escape(w) for w in sorted(set(COLLECTIVE_WORDS.values()))) + "|collective)"
)
#: What a step's expected time comes from: its engine batch, or the run's other steps of its kind.
BASIS_BATCH = "for its batch"
BASIS_RUN = "from the run's other steps"
_SIZE = r"\d+(?:\.\d+)? (?:B|kB|MB|GB|TB)"


def collective_word(kind: str) -> str:
    """A collective kind ("allreduce", "all_reduce", "AllReduce") as a sentence says it."""
    key = re.sub(r"[^a-z]", "", kind.lower())
    return COLLECTIVE_WORDS.get(key, "collective")


def format_size_range(value: object) -> str:
    """A size or a range of sizes: '4.61 kB', '98.3 kB to 1.57 MB' (one size where both ends
    read the same)."""
    if isinstance(value, tuple):
        least, most = (format_bytes(v) for v in value)
        return least if least == most else f"{least} to {most}"
    return format_bytes(float(value))  # type: ignore[arg-type]


def plural(count: int, noun: str) -> str:
    """'1 step', '3 steps'."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def format_bytes(value: float) -> str:
    """142 kB, 1.5 MB (decimal units, three significant digits)."""
    value = float(value)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            shown = value / scale
            return f"{shown:.3g} {unit}" if shown < 100 else f"{shown:.0f} {unit}"
    return f"{value:.0f} B"


def format_share(share: float) -> str:
    """A share of an excess: 'all', 'under 1%' or a whole percentage below 100."""
    if share >= 0.995:
        return "all"
    if share < 0.005:
        return "under 1%"
    return f"{min(round(share * 100), 99)}%"


@dataclass(frozen=True)
class Collectives:
    """How many collectives of one kind a sentence names, with their size when the trace has it:
    one size for all of them, or the range from the smallest to the largest."""

    count: int
    kind: str  # as `collective_word` says it
    size_bytes: float | None = None
    largest_bytes: float | None = None

    def __str__(self) -> str:
        text = plural(self.count, self.kind)
        if self.size_bytes is None:
            return text
        smallest = format_bytes(self.size_bytes)
        largest = format_bytes(self.largest_bytes) if self.largest_bytes is not None else smallest
        if largest != smallest:
            return f"{text} of {smallest} to {largest}"
        return f"{text} of {smallest}" + (" each" if self.count != 1 else "")


@dataclass(frozen=True)
class SlotType:
    """What a slot holds: how a value is written, and the pattern `parse` reads it back with."""

    pattern: str
    render: Callable[[object], str] = str


def operator_text(value: object) -> str:
    """An operator's name as an explanation shows it (long kernel names keep their head)."""
    return short_name(str(value), OPERATOR_CHARS)


_INT = SlotType(r"\d+", lambda v: str(int(v)))  # type: ignore[call-overload]
_NS = SlotType(_DURATION, lambda v: format_ns(float(v)))  # type: ignore[arg-type]
#: A fraction of a step's time as the breakdown writes it everywhere (38%, 4.2%, 99.6%, <0.1%,
#: >99.9%).
_PERCENT = SlotType(
    r"<0\.1%|>99\.9%|\d{1,3}(?:\.\d)?%",
    lambda v: percentage(float(v), 1.0),  # type: ignore[arg-type]
)
SLOT_TYPES: dict[str, SlotType] = {
    "step": _INT,
    "kind": SlotType(r"[A-Za-z][\w\- ]*"),
    "rank": _INT,
    "other_rank": _INT,
    "peer_rank": _INT,
    "layer": _INT,
    "layers": _INT,
    "faults": _INT,
    "normal_faults": _INT,
    "op": SlotType(r".+?", operator_text),
    "other_op": SlotType(r".+?", operator_text),
    "steps": SlotType(
        _COUNT_WORDS.format(noun="step"),
        lambda v: plural(int(v), "step"),  # type: ignore[call-overload]
    ),
    **{
        name: SlotType(
            _COUNT_WORDS.format(noun="request"),
            lambda v: plural(int(v), "request"),  # type: ignore[call-overload]
        )
        for name in ("held_back", "preempted")
    },
    **{
        name: SlotType(
            _COUNT_WORDS.format(noun="token"),
            lambda v: plural(int(v), "token"),  # type: ignore[call-overload]
        )
        for name in ("tokens", "normal_tokens", "largest_tokens")
    },
    "collectives": SlotType(
        _COUNT_WORDS.format(noun=_COLLECTIVE) + rf"(?: of {_SIZE}(?: each| to {_SIZE})?)?",
    ),
    "basis": SlotType(f"{BASIS_BATCH}|{BASIS_RUN}"),
    "idle_share": _PERCENT,
    "cause_share": _PERCENT,
    # the host's runtime call and the CPU operator that made it, while the GPU sat idle; not
    # `op`, which is the verdict's operator claim
    "host_call": SlotType(r".+?", operator_text),
    "host_op": SlotType(r".+?", operator_text),
    "share": SlotType(r"all|under 1%|\d{1,2}%", lambda v: format_share(float(v))),  # type: ignore[arg-type]
    **{
        name: SlotType(rf"{_SIZE}(?: to {_SIZE})?", format_size_range)
        for name in ("large_sizes", "small_sizes")
    },
    **{
        name: _NS
        for name in (
            "dur",
            "expected",
            "observed",
            "normal",
            "peers",
            "late",
            "waited",
            "own",
            "excess",
            "named",
            "rest",
            "other_observed",
            "other_normal",
            "large_excess",
            "small_excess",
        )
    },
}

_SLOT = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Plan:
    """One sentence: its id (family.name), template, and the fault type it states (None: any)."""

    id: str
    template: str
    fault: str | None = None
    note: str = ""  # when the plan is chosen, for docs/explanations.md
    slots: tuple[str, ...] = field(init=False)
    regex: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        slots = tuple(_SLOT.findall(self.template))
        unknown = [s for s in slots if s not in SLOT_TYPES]
        if unknown:
            raise ValueError(f"plan {self.id}: unknown slots {unknown}")
        if self.family not in FAMILIES:
            raise ValueError(f"plan {self.id}: unknown family {self.family}")
        pattern = ""
        position = 0
        for match in _SLOT.finditer(self.template):
            pattern += re.escape(self.template[position : match.start()])
            name = match.group(1)
            pattern += f"(?P<{name}>{SLOT_TYPES[name].pattern})"
            position = match.end()
        pattern += re.escape(self.template[position:])
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "regex", re.compile(pattern))

    @property
    def family(self) -> str:
        return self.id.split(".", 1)[0]

    def render(self, **facts: object) -> str:
        missing = [s for s in self.slots if s not in facts or facts[s] is None]
        if missing:
            raise ValueError(f"plan {self.id} needs {missing}")
        return _SLOT.sub(lambda m: SLOT_TYPES[m.group(1)].render(facts[m.group(1)]), self.template)


_PLANS = (
    # -- what was observed ---------------------------------------------------------------------
    Plan(
        "observed.slow",
        "Step {step} ({kind}) took {dur} on rank {rank}, against {expected} expected {basis}.",
        note="a step slower than expected (from its batch, or from the run's other steps of its "
        "kind where no engine batch defines it); the duration is the named rank's own",
    ),
    Plan(
        "observed.within",
        "Step {step} ({kind}) took {dur} on rank {rank}, no more than expected {basis}, "
        "but one of its operators stands out.",
        note="a step flagged by an operator alone (a persistent shift, a layer outlier)",
    ),
    Plan(
        "observed.only",
        "Step {step} ({kind}), the only one captured, took {dur} on rank {rank}, and one of its "
        "operators stands out.",
        note="the same, in a capture of one step per rank: no other step to expect its time from",
    ),
    Plan(
        "observed.no_rank",
        "Step {step} ({kind}) took {dur}, against {expected} expected {basis}.",
        note="a slow step with no candidate node, so no rank to name",
    ),
    Plan(
        "observed.hang",
        "Step {step} never finished: rank {rank} never reached {op}, and its peers waited in it "
        "for {waited} until a watchdog or the profiler stopped them.",
        note="the step a hang left unfinished",
    ),
    # -- the pointed node against its normal ---------------------------------------------------
    Plan(
        "evidence.temporal",
        "On rank {rank}, {op} took {observed} against {normal} in the nearest normal steps.",
        note="an operator measured against the same instance in the rank's nearest normal steps",
    ),
    Plan(
        "evidence.temporal_peer",
        "On rank {rank}, {op} took {observed} against {normal} in the nearest normal steps, "
        "and {peers} on rank {peer_rank} in this step.",
        note="the same, with the one peer rank's time for the operator in this step",
    ),
    Plan(
        "evidence.temporal_peers",
        "On rank {rank}, {op} took {observed} against {normal} in the nearest normal steps, "
        "and {peers} on its peers in this step (median).",
        note="the same, with the peer ranks' median time for the operator in this step",
    ),
    Plan(
        "evidence.peers",
        "On rank {rank}, {op} took {observed} against {normal} on its peers in this step.",
        note="an operator measured against its peers in the same step (no normal step had it)",
    ),
    Plan(
        "evidence.layer",
        "On rank {rank}, {op} took {observed} in layer {layer} of {layers}, against {normal} at "
        "the same place in the step's other layers.",
        note="an instance far slower than the same slot in the step's other repeated layers",
    ),
    Plan(
        "evidence.repeat",
        "On rank {rank}, {op}, launched by {other_op}, took {observed} against {normal} for the "
        "same launch in the run's other steps.",
        note="a kernel far slower than the same launch of the same call in the run's other steps",
    ),
    Plan(
        "evidence.frame",
        "On rank {rank}, {op} spent {observed} in itself, between the operators it runs, against "
        "{normal} in the run's other steps.",
        note="a user annotation or Python frame whose own time (its thread stopped between two "
        "of its operators) is far over the same frame's in the run's other steps",
    ),
    Plan(
        "evidence.repeat_peers",
        "On rank {rank}, {op}, launched by {other_op}, took {observed} against {normal} for the "
        "same launch on the other ranks in this step.",
        note="a kernel far slower than the same launch of the same call on the peers in the step",
    ),
    Plan(
        "evidence.wait",
        "On rank {rank}, {op} took {observed} against {normal} for the same collective in the "
        "run's other steps.",
        note="on a one-rank trace, a collective longer than in every other step by far more "
        "than it varies there",
    ),
    Plan(
        "evidence.new_operator",
        "On rank {rank}, {op} ran for {observed}, although most normal steps never run it.",
        note="an operator the usual work does not run (a fallback path, a swapped-in kernel)",
    ),
    Plan(
        "evidence.substituted",
        "On rank {rank}, {op} ran for {observed} where its peers launch another kernel.",
        note="a kernel one rank launches where its tensor-parallel peers launch another",
    ),
    Plan(
        "evidence.shift",
        "On rank {rank}, {op} took {observed} against {normal} on its peers, and has been slower "
        "for {steps}.",
        note="a persistent shift: one rank's operator slower than its peers' step after step",
    ),
    Plan(
        "evidence.idle",
        "On rank {rank}, the GPU sat idle for {observed} while {op} ran on the host before the "
        "next launch, against {normal} in the nearest normal steps.",
        note="host work that kept the GPU idle",
    ),
    Plan(
        "evidence.arrival",
        "Rank {rank} reached {op} {observed} after its peers, against {normal} usually.",
        note="a late arrival at a collective, against the rank's usual skew",
    ),
    Plan(
        "evidence.arrival_first",
        "Rank {rank} reached {op} {observed} after its peers, where it is usually on time.",
        note="the same, for a rank that is never late there in the normal steps",
    ),
    Plan(
        "evidence.transfer",
        "On rank {rank}, the last to arrive, {op} itself took {observed} against {normal} "
        "normally.",
        note="a collective's own time on its last arriver (no waiting in it)",
    ),
    Plan(
        "evidence.own_share",
        "On rank {rank}, its own time in {op} was {observed} against {normal} normally.",
        note="a straggler's own time in a collective of a step it did not reach late (a "
        "host-run collective waits on its throttled threads)",
    ),
    Plan(
        "evidence.forward",
        "On rank {rank}, the whole forward ({op}) took {observed} against {normal} expected for "
        "the batch.",
        note="the model's outermost module scope, when every operator grew alike",
    ),
    Plan("evidence.none", "No single operator stands out.", note="no candidate node"),
    # -- what the rank's work did (the model's explanation head chooses among these) -----------
    Plan(
        "mechanism.late_arrival",
        "Rank {rank} arrived {late} late in total at {collectives}, against {normal} in its "
        "normal steps of this kind; its peers waited {waited} there, while its own time there "
        "was {own}.",
        note="the rank arrived last at collectives of the step, measured on every rank",
    ),
    Plan(
        "mechanism.late_arrival_first",
        "Rank {rank} arrived {late} late in total at {collectives}, where it is usually on time; "
        "its peers waited {waited} there, while its own time there was {own}.",
        note="the same, for a rank never late in its normal steps of this kind",
    ),
    Plan(
        "mechanism.late_arrival_first_said",
        "Rank {rank} arrived {late} late in total at {collectives}; its peers waited {waited} "
        "there, while its own time there was {own}.",
        note="the same, after the evidence has said the rank is usually on time there",
    ),
    Plan(
        "mechanism.host_slower",
        "Rank {rank}'s host operators took {observed} in this step, against {normal} in its "
        "normal steps of this kind.",
        note="the rank's host self time (operators and runtime calls, waits left out)",
    ),
    Plan(
        "mechanism.gpu_slower",
        "Rank {rank}'s kernels took {observed} in this step, against {normal} in its normal "
        "steps of this kind.",
        note="the rank's GPU work (kernels and copies)",
    ),
    Plan(
        "mechanism.launch_gaps",
        "Rank {rank}'s GPU sat idle for {observed} waiting for the host's launches, against "
        "{normal} in its normal steps of this kind.",
        note="GPU idle time whose next launch came after the GPU went idle",
    ),
    Plan(
        "mechanism.transfer_slower",
        "The step's collectives took {observed} of transfer on the ranks that arrived last, "
        "against {normal} in normal steps of this kind.",
        note="the last arrivers' own collective time, which has no waiting in it",
    ),
    Plan(
        "mechanism.recompute",
        "The step ran {tokens} of context, against a median of {normal_tokens} in its normal "
        "steps of this kind.",
        note="more context tokens than usual, as recomputed prefills add",
    ),
    Plan(
        "mechanism.small_batches",
        "The step batched {tokens}, against {largest_tokens} in the run's largest step.",
        note="a batch far below what the engine ran earlier in the run",
    ),
    Plan(
        "mechanism.small_batches_queued",
        "The step batched {tokens}, against {largest_tokens} in the run's largest step, while "
        "{held_back} waited that it had room for.",
        note="the same, where the run's request records show requests left waiting that the "
        "step had room for (`teller.align.requests.held_back_requests`)",
    ),
    # -- the cause: the fault head's ----------------------------------------------------------
    # -- what the host counters measured (`teller collect` samples them beside the trace) ----
    Plan(
        "host.throttled_ns",
        "Host counters: rank {rank}'s CPU quota throttled it for {observed} of this step, "
        "against {normal} in its normal steps.",
        note="the rank's cgroup CPU quota (cpu.stat throttled time) over the step",
    ),
    Plan(
        "host.stopped_ns",
        "Host counters: rank {rank} was stopped for {observed} of this step, against {normal} "
        "in its normal steps.",
        note="time the rank's process was seen stopped (SIGSTOP, a debugger)",
    ),
    Plan(
        "host.run_delay_ns",
        "Host counters: rank {rank} waited {observed} for a CPU in this step, against {normal} "
        "in its normal steps.",
        note="time runnable but not running (schedstat run delay): another process on its core",
    ),
    Plan(
        "host.memory_stall_ns",
        "Host counters: rank {rank} stalled {observed} on memory in this step, against {normal} "
        "in its normal steps.",
        note="the cgroup's memory stall time (memory.pressure, cgroup v2)",
    ),
    Plan(
        "host.major_faults",
        "Host counters: rank {rank} took {faults} major page faults in this step, against "
        "{normal_faults} in its normal steps.",
        note="major page faults (a page read back from disk or swap)",
    ),
    Plan(
        "host.cpu_ns",
        "Host counters: rank {rank} used {observed} of CPU time in this step, against {normal} "
        "in its normal steps, neither throttled nor waiting for a CPU.",
        note="the rank's own CPU time, when no quota, co-tenant or memory stall rose",
    ),
    Plan(
        "cause.straggler",
        "This points to rank {rank} as a straggler: its own work ran late, and its peers' "
        "collective time is waiting for it, not transfer.",
        fault="straggler",
    ),
    Plan(
        "cause.straggler_or_link",
        "This points to rank {rank} as a straggler, though its own {own} in those collectives "
        "is more than its {late} of late arrival: a slower link from that rank would look "
        "alike here.",
        fault="straggler",
        note="the rank's own time in the collectives it reached late exceeds its lateness, and "
        "the step's transfer rose",
    ),
    Plan(
        "cause.straggler_held",
        "This points to rank {rank} as a straggler: its own work ran late, and its own {own} in "
        "those collectives, more than its {late} of late arrival, was held back with it, not "
        "slowed by a link.",
        fault="straggler",
        note="the host counters show the rank held off a CPU, and its own time in the "
        "collectives it reached late exceeds its lateness (collectives that run on its CPU)",
    ),
    Plan(
        "cause.straggler_share",
        "This points to rank {rank} as the straggler of its incident: it was no later to this "
        "step's collectives than usual, but their transfer waited on it, and its peers with it.",
        fault="straggler",
        note="the straggler named by its own share of a collective (`evidence.own_share`)",
    ),
    Plan(
        "cause.straggler_alone",
        "This points to rank {rank}'s own work running late, as a throttled or descheduled "
        "process's does.",
        fault="straggler",
        note="one rank in the trace",
    ),
    Plan(
        "cause.peer_wait",
        "This points to rank {rank} waiting in the collective: a peer rank the trace does not "
        "hold arrived late, or the link to it slowed.",
        fault="straggler",
        note="a collective that waited, on a one-rank trace",
    ),
    Plan(
        "cause.cpu_contention",
        "This points to other processes taking CPU time from rank {rank}: its operators "
        "stretched, and its peers waited for it at the collectives.",
        fault="cpu_contention",
    ),
    Plan(
        "cause.cpu_contention_alone",
        "This points to other processes taking CPU time from rank {rank}, stretching its "
        "operators.",
        fault="cpu_contention",
        note="one rank in the trace",
    ),
    Plan(
        "cause.host_cpu_contention",
        "This points to a contended host CPU on rank {rank}: its kernel launches lagged and its "
        "GPU idled.",
        fault="host_cpu_contention",
    ),
    Plan(
        "cause.host_stall",
        "This points to rank {rank}'s host stalling between operators, as a garbage-collection "
        "pause does, while its peers waited for it.",
        fault="host_stall",
    ),
    Plan(
        "cause.host_stall_alone",
        "This points to rank {rank}'s host stalling between operators, as a garbage-collection "
        "pause does.",
        fault="host_stall",
        note="one rank in the trace",
    ),
    Plan(
        "cause.memory_pressure",
        "This points to memory pressure on rank {rank}: page faults slowed its host operators.",
        fault="memory_pressure",
    ),
    Plan(
        "cause.slow_operator",
        "This points to an operator on rank {rank} running a slower implementation than on its "
        "peers.",
        fault="slow_operator",
    ),
    Plan(
        "cause.slow_operator_alone",
        "This points to an operator on rank {rank} running a slower implementation than usual.",
        fault="slow_operator",
        note="one rank in the trace",
    ),
    Plan(
        "cause.kernel_regression",
        "This points to a kernel regression on rank {rank}: a slower kernel, or kernels no "
        "longer replayed from a CUDA graph, running where the fast path ran.",
        fault="kernel_regression",
    ),
    Plan(
        "cause.gpu_throttle",
        "This points to GPU {rank} running at lower clocks, as under a power cap or a thermal "
        "limit, which slows all its kernels alike.",
        fault="gpu_throttle",
    ),
    Plan(
        "cause.gpu_contention",
        "This points to another process sharing GPU {rank}, which slows its kernels unevenly.",
        fault="gpu_contention",
    ),
    Plan(
        "cause.kv_pressure",
        "This points to a KV cache too small for the load: requests were preempted and their "
        "prefills recomputed.",
        fault="kv_pressure",
        note="without a preemption in the step's aligned engine logs",
    ),
    Plan(
        "cause.kv_pressure_logged",
        "This points to a KV cache too small for the load: the engine logged that it preempted "
        "{preempted} in this step for want of KV cache space; a preempted request runs its "
        "prefill again.",
        fault="kv_pressure",
        note="the step's aligned preemption lines (`AlignResult.preempted`)",
    ),
    Plan(
        "cause.scheduler_misconfig",
        "This points to scheduler limits too small for the load: requests queued while batches "
        "stayed small.",
        fault="scheduler_misconfig",
    ),
    Plan(
        "cause.net_delay",
        "This points to added latency on rank {rank}'s network link.",
        fault="net_delay",
        note="without a measurement of the collectives by size (`teller.rca.link_size`)",
    ),
    Plan(
        "cause.net_delay_sized",
        "This points to added latency on rank {rank}'s network link: in the flagged steps, "
        "collectives of {large_sizes} took {large_excess} longer than usual and those of "
        "{small_sizes} {small_excess} on average, not in proportion to their size.",
        fault="net_delay",
        note="the mean excess of the larger and the smaller half of the incident's collectives "
        "by bytes, each half's range of sizes, where the larger half's excess is under the "
        "geometric mean of 1 and the size ratio times the smaller's",
    ),
    Plan(
        "cause.bandwidth_throttle",
        "This points to lost bandwidth on rank {rank}'s network link.",
        fault="bandwidth_throttle",
        note="without a measurement of the collectives by size",
    ),
    Plan(
        "cause.bandwidth_throttle_sized",
        "This points to lost bandwidth on rank {rank}'s network link: in the flagged steps, "
        "collectives of {large_sizes} took {large_excess} longer than usual and those of "
        "{small_sizes} {small_excess} on average, growing with their size.",
        fault="bandwidth_throttle",
        note="the same measurement, where the larger half's excess is at least that mean",
    ),
    Plan(
        "cause.net_throttle",
        "This points to a rate limit on rank {rank}'s network link.",
        fault="net_throttle",
        note="without a measurement of the collectives by size",
    ),
    Plan(
        "cause.net_throttle_sized",
        "This points to a rate limit on rank {rank}'s network link: in the flagged steps, "
        "collectives of {large_sizes} took {large_excess} longer than usual and those of "
        "{small_sizes} {small_excess} on average, growing with their size.",
        fault="net_throttle",
        note="the same measurement, where the larger half's excess is at least that mean",
    ),
    Plan(
        "cause.link_contention",
        "This points to contention on the link between rank {rank} and its ring neighbour.",
        fault="link_contention",
    ),
    Plan(
        "cause.collective_hang",
        "This points to a collective hang: a rank that never arrived, not a slow one.",
        fault="collective_hang",
    ),
    # -- how much of the step's excess the evidence explains -----------------------------------
    Plan(
        "share.excess",
        "The excess of {op} on rank {rank}, {named}, is {share} of the step's {excess} excess.",
        note="the evidence's excess over its normal, against the step's on the named rank",
    ),
    Plan(
        "share.late",
        "Those late arrivals, {named} beyond its usual, are {share} of the step's {excess} excess.",
        note="the mechanism's lateness beyond the rank's usual, when it arrived late",
    ),
    Plan(
        "share.late_peers",
        "Those late arrivals, {named} beyond its usual, are {share} of the step's {excess} "
        "excess on its peers, which waited for it.",
        note="the same, when they exceed the named rank's own excess: the straggler's step ends "
        "with its last collective, its peers' step with their wait, so the share is of theirs "
        "(the slowest rank's time)",
    ),
    Plan(
        "share.late_beyond",
        "Those late arrivals, {named} beyond its usual, exceed the step's {excess} excess; the "
        "rest of the step took less than expected.",
        note="the same, when they are over half again the excess: 'all of' would hide that the "
        "step's other work made up the difference (the excess is the sum of both)",
    ),
    Plan(
        "share.late_peers_beyond",
        "Those late arrivals, {named} beyond its usual, exceed the step's {excess} excess on its "
        "peers, which waited for it; the rest of their step took less than expected.",
        note="the same, on the peers' step",
    ),
    Plan(
        "share.late_rest_operator",
        "Those late arrivals, {named} beyond its usual, are {share} of the step's {excess} "
        "excess; {other_op} on rank {other_rank} also rose, to {other_observed} against "
        "{other_normal} normally.",
        note="the same, when the pointed operator's own excess is under a third of the step's: "
        "the rank's other candidate with the largest excess",
    ),
    Plan(
        "share.rise",
        "That rise of {named} is {share} of the step's {excess} excess.",
        note="the mechanism's rise over its normal (host, GPU, idle or transfer time)",
    ),
    Plan(
        "share.rise_beyond",
        "That rise of {named} exceeds the step's {excess} excess: it overlapped other work, or "
        "the rest of the step took less than expected.",
        note="the same, when it is over half again the excess: the step's time is not the sum "
        "of its parts (a GPU collective overlaps compute on other streams, and the transfer "
        "is summed over the ranks that arrived last)",
    ),
    Plan(
        "share.rise_rest_operator",
        "That rise of {named} is {share} of the step's {excess} excess; {other_op} on rank "
        "{other_rank} also rose, to {other_observed} against {other_normal} normally.",
        note="the same, when the pointed operator's own excess is under a third of the step's",
    ),
    Plan(
        "share.rest_operator",
        "The excess of {op} on rank {rank}, {named}, is only {share} of the step's {excess} "
        "excess; {other_op} on rank {other_rank} also rose, to {other_observed} against "
        "{other_normal} normally.",
        note="under a third explained: the step's other candidate with the largest excess, on "
        "the named rank where it has one (its rise is not a share: a peer's wait can exceed the "
        "step's excess)",
    ),
    Plan(
        "share.rest_none",
        "The excess of {op} on rank {rank}, {named}, is only {share} of the step's {excess} "
        "excess; the other {rest} is under no single operator the trace measures.",
        note="under a third explained and no other candidate takes a tenth of the excess",
    ),
    # -- where the named rank's step went (`teller.callchain.breakdown`) -------------------------
    Plan(
        "time.idle_sync",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time; {cause_share} of that "
        "idle time fell inside a blocking call ({host_call} in {host_op}).",
        note="GPU idle time, where it is a tenth of the step or more, and its largest part: "
        "inside a call that blocks the host until the GPU is done (a synchronize, a copy to "
        "pageable memory), with the CPU operator that made it (aten::item, .cpu())",
    ),
    Plan(
        "time.idle_sync_call",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time; {cause_share} of that "
        "idle time fell inside a blocking call ({host_call}).",
        note="the same, for a blocking call made outside any CPU operator",
    ),
    Plan(
        "time.idle_sync_unnamed",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time; {cause_share} of that "
        "idle time fell inside blocking calls.",
        note="the same, where the trace does not name the call",
    ),
    Plan(
        "time.idle_launch",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time; {cause_share} of that "
        "idle time fell inside the host's launch calls ({host_call} in {host_op}).",
        note="GPU idle time whose largest part the host spent launching work: launch-bound",
    ),
    Plan(
        "time.idle_launch_call",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time; {cause_share} of that "
        "idle time fell inside the host's launch calls ({host_call}).",
        note="the same, for launches made outside any CPU operator",
    ),
    Plan(
        "time.idle_launch_unnamed",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time; {cause_share} of that "
        "idle time fell inside the host's launch calls.",
        note="the same, where the trace does not name the call",
    ),
    Plan(
        "time.idle_scheduler",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time; {cause_share} of that "
        "idle time fell inside the engine's scheduler.",
        note="GPU idle time whose largest part the host spent in a serving engine's scheduler",
    ),
    Plan(
        "time.idle_host",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time; {cause_share} of that "
        "idle time fell while the host ran Python or CPU operators between launches.",
        note="GPU idle time whose largest part the host spent in Python or CPU operators",
    ),
    Plan(
        "time.idle_unrecorded",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time; {cause_share} of that "
        "idle time fell where the trace records nothing on the host.",
        note="GPU idle time whose largest part has no host event around it (an untraced thread, "
        "a stopped process, time outside the profiler's host capture)",
    ),
    Plan(
        "time.idle",
        "In step {step}, rank {rank}'s GPU was idle for {idle_share} of the time.",
        note="GPU idle time with no part the breakdown attributes",
    ),
    # -- what the trace cannot tell -----------------------------------------------------------
    Plan(
        "caveat.cpu",
        "No host metrics in the trace: CPU throttling and CPU contention look alike here.",
        note="straggler, cpu_contention, host_cpu_contention",
    ),
    Plan(
        "caveat.stall",
        "No host metrics in the trace: a garbage-collection pause and a descheduled process look "
        "alike here.",
        note="host_stall",
    ),
    Plan(
        "caveat.memory",
        "No memory counters in the trace: page faults are inferred from slower host operators, "
        "not counted.",
        note="memory_pressure",
    ),
    Plan(
        "caveat.gpu",
        "No GPU clock or power readings in the trace: a power cap and a co-tenant are told apart "
        "only by how evenly the kernels slowed.",
        note="gpu_throttle, gpu_contention",
    ),
    Plan(
        "caveat.kernel",
        "The trace shows which kernels ran, not which setting changed them.",
        note="slow_operator, kernel_regression",
    ),
    Plan(
        "caveat.link",
        "No link counters in the trace: the link is judged by collective times alone.",
        note="net_delay, bandwidth_throttle, net_throttle, link_contention",
    ),
    Plan(
        "caveat.link_alike",
        "Rank {rank}'s collectives took {own} in this step and its peers' {peers}: their times "
        "alone cannot tell whether the link is this rank's or a peer's.",
        note="a link fault where the named rank's own collective time in the step is under 1.5x "
        "its peers' median (every member of a collective waits for its slowest link)",
    ),
    Plan(
        "caveat.link_ends",
        "With two ranks, a slower link slows both of its ends alike: the trace cannot tell "
        "which end's link it is.",
        note="a link fault on a two-rank trace",
    ),
    Plan(
        "caveat.no_logs",
        "No engine logs: preemptions and the request queue cannot be confirmed.",
        note="kv_pressure, scheduler_misconfig, when the run has no engine logs",
    ),
    Plan(
        "caveat.peer_wait",
        "One rank in the trace: a late peer and a slower link look alike here, and which peer "
        "was late cannot be seen.",
        note="a collective that waited, on a one-rank trace",
    ),
    Plan(
        "caveat.first_step",
        "Step {step} is the first step in the capture, where one-time set-up lands (the "
        "allocator's first blocks, kernel autotuning, lazy module loading); a capture that "
        "starts a few steps later tells it apart from a fault.",
        note="any verdict on the first step a rank's capture holds",
    ),
    Plan(
        "caveat.first_call",
        "Layer 1 holds each operator's first call in the capture, where one-time set-up "
        "lands (kernel autotuning such as cuDNN's benchmark mode, lazy module loading); "
        "a capture of a few steps tells it apart from a fault.",
        note="a one-step capture's verdict naming an operator's first layer against its others",
    ),
    Plan(
        "caveat.one_rank",
        "One rank in the trace: its effect on peer ranks cannot be seen.",
        note="any rank-specific fault on a one-rank trace",
    ),
)

#: Every plan, by id.
PLANS: dict[str, Plan] = {plan.id: plan for plan in _PLANS}
if len(PLANS) != len(_PLANS):
    raise ValueError("two plans share an id")

#: The mechanism plans the model's explanation head chooses among, in its output order; "none"
#: states no mechanism (the evidence and the cause say it all).
MECHANISMS: tuple[str, ...] = (
    "none",
    "late_arrival",
    "host_slower",
    "gpu_slower",
    "launch_gaps",
    "transfer_slower",
    "recompute",
    "small_batches",
)


def _stated_mechanism(plan_id: str) -> str | None:
    """The mechanism a mechanism plan states: its name, or the name its variant extends (a rank
    usually on time, `late_arrival_first`; a queue measured, `small_batches_queued`)."""
    name = plan_id.split(".", 1)[1]
    stated = [m for m in MECHANISMS[1:] if name == m or name.startswith(f"{m}_")]
    return max(stated, key=len, default=None)


#: The mechanism plan(s) that state each mechanism, its variants included.
MECHANISM_PLANS: dict[str, tuple[str, ...]] = {
    m: tuple(p.id for p in _PLANS if p.family == "mechanism" and _stated_mechanism(p.id) == m)
    for m in MECHANISMS[1:]
}
if sorted(p for plans in MECHANISM_PLANS.values() for p in plans) != sorted(
    p.id for p in _PLANS if p.family == "mechanism"
):
    raise ValueError("every mechanism plan states one of MECHANISMS")


def render(plan_id: str, **facts: object) -> str:
    """One sentence: the plan's template with its slots filled from `facts`."""
    return PLANS[plan_id].render(**facts)


@dataclass(frozen=True)
class Said:
    """One parsed sentence: its plan and the text of each slot."""

    plan: str
    slots: dict[str, str]


def parse(text: str) -> list[Said] | None:
    """The plans `text` is made of, in order, or None when some part of it is no plan's sentence
    or the families are out of order (in `FAMILIES` order, each once but for `REPEATED`)."""
    return _parse(text.strip(), 0, -1)


def _parse(text: str, position: int, family: int) -> list[Said] | None:
    if position >= len(text):
        return []
    for plan in _PLANS:
        rank = FAMILIES.index(plan.family)
        if rank < family or (rank == family and plan.family not in REPEATED):
            continue
        match = plan.regex.match(text, position)
        if match is None:
            continue
        end = match.end()
        if end < len(text) and text[end] != " ":
            continue
        rest = _parse(text, end + 1 if end < len(text) else end, rank)
        if rest is not None:
            return [Said(plan.id, match.groupdict()), *rest]
    return None


def well_formed(text: str) -> bool:
    return parse(text) is not None


#: A value for every slot, for the examples docs/explanations.md shows under each plan.
EXAMPLE_FACTS: dict[str, object] = {
    "step": 45,
    "kind": "decode",
    "rank": 1,
    "other_rank": 1,
    "peer_rank": 0,
    "layer": 7,
    "layers": 24,
    "faults": 1_840,
    "normal_faults": 3,
    "op": "aten::mm",
    "other_op": "aten::cat",
    "steps": 12,
    "held_back": 3,
    "preempted": 2,
    "tokens": 16,
    "normal_tokens": 120,
    "largest_tokens": 1_024,
    "collectives": str(Collectives(24, "all-reduce", 142_848)),
    "basis": BASIS_BATCH,
    "share": 0.81,
    "idle_share": 0.38,
    "cause_share": 0.71,
    "host_call": "cudaStreamSynchronize",
    "host_op": "aten::item",
    "dur": 509e6,
    "expected": 55.6e6,
    "observed": 6.07e6,
    "normal": 4.79e6,
    "peers": 6.1e6,
    "late": 597e6,
    "waited": 597e6,
    "own": 79.9e6,
    "excess": 454e6,
    "named": 367e6,
    "rest": 87e6,
    "other_observed": 372e6,
    "other_normal": 4.74e6,
    "large_sizes": (393_216, 1_572_864),
    "small_sizes": (4_608, 98_304),
    "large_excess": 312e6,
    "small_excess": 41e6,
}


#: Where a plan's example needs other values to read as it would be used.
EXAMPLE_OVERRIDES: dict[str, dict[str, object]] = {
    "share.late_beyond": {"named": 597e6, "excess": 212e6},
    "share.late_peers_beyond": {"named": 597e6, "excess": 212e6},
    "share.rise_beyond": {"named": 3.68e6, "excess": 822e3},
    "cause.net_delay_sized": {"large_excess": 5.2e6, "small_excess": 5.0e6},
    "share.rest_operator": {"named": 1.28e6, "share": 0.003},
    "share.rest_none": {"named": 1.28e6, "share": 0.003, "rest": 453e6},
    "evidence.repeat": {"op": "ampere_sgemm_128x64_tn", "other_op": "aten::mm"},
    "evidence.frame": {"op": "## forward ##", "observed": 21.8e6, "normal": 256e3},
    "evidence.repeat_peers": {"op": "ampere_sgemm_128x64_tn", "other_op": "aten::mm"},
    "evidence.wait": {"op": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "normal": 1.52e6},
    "cause.straggler_or_link": {"own": 787e6, "late": 9.15e6},
    "cause.straggler_held": {"own": 151e6, "late": 57.5e6},
    **{
        plan: {"host_call": "cudaLaunchKernel", "host_op": "aten::mm"}
        for plan in ("time.idle_launch", "time.idle_launch_call")
    },
}


def example(plan_id: str) -> str:
    """The plan rendered with `EXAMPLE_FACTS` (and its `EXAMPLE_OVERRIDES`)."""
    plan = PLANS[plan_id]
    facts = {**EXAMPLE_FACTS, **EXAMPLE_OVERRIDES.get(plan_id, {})}
    return plan.render(**{s: facts[s] for s in plan.slots})


def plans_markdown() -> str:
    """The plan catalogue as docs/explanations.md lists it: per family, each plan's id, the
    fault type it states, when it is used, and an example."""
    lines = []
    for family in FAMILIES:
        lines += [f"### {family}", "", "| plan | fault | used for | example |", "|---|---|---|---|"]
        for plan in _PLANS:
            if plan.family == family:
                lines.append(
                    f"| `{plan.id}` | {plan.fault or '—'} | {plan.note or '—'} | {example(plan.id)} |"
                )
        lines.append("")
    return "\n".join(lines)
