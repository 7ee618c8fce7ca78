"""Sentence plans: every plan renders and parses back, the docs list them all, and whatever the
heads say, every explanation is made of plans whose fault, rank and operator are the heads'."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from teller.eval.metrics import agreement
from teller.faults import FAULT_FREE
from teller.localize import NEW_OPERATOR, SUBSTITUTED, OperatorCandidate
from teller.localize.collectives import OWN_SHARE_REFERENCE
from teller.rca.context import LateArrivals, Measured, StepContext
from teller.rca.explain import (
    FAULT_MECHANISMS,
    allowed_mechanisms,
    choose_mechanism,
    compose,
)
from teller.rca.inputs import FAULT_NAMES
from teller.rca.link_size import SizeGrowth
from teller.rca.plans import (
    FAMILIES,
    MECHANISMS,
    PLANS,
    Collectives,
    example,
    format_share,
    operator_text,
    parse,
    plans_markdown,
    plural,
    render,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "explanations.md"


@pytest.mark.parametrize("plan_id", sorted(PLANS))
def test_every_plan_renders_and_parses_back_to_itself(plan_id):
    text = example(plan_id)
    said = parse(text)
    assert said is not None and [s.plan for s in said] == [plan_id]
    assert "{" not in text and text.endswith(".") and text[0].isupper()


def test_the_docs_list_every_plan_with_its_example():
    docs = DOCS.read_text()
    assert plans_markdown() in docs  # regenerate the listing with plans_markdown()
    for plan_id in PLANS:
        assert f"`{plan_id}`" in docs and example(plan_id) in docs


def test_counts_agree_with_their_nouns():
    assert plural(1, "step") == "1 step" and plural(3, "step") == "3 steps"
    assert str(Collectives(1, "all-reduce", 142_848)) == "1 all-reduce of 143 kB"
    assert str(Collectives(24, "all-reduce")) == "24 all-reduces"
    assert str(Collectives(2, "all-reduce", 1e3, 1e3)) == "2 all-reduces of 1 kB each"
    ranged = str(Collectives(12, "all-reduce", 24_576, 142_848))
    assert ranged == "12 all-reduces of 24.6 kB to 143 kB"
    late = render(
        "mechanism.late_arrival",
        rank=1,
        late=5e6,
        collectives=ranged,
        normal=1e6,
        waited=5e6,
        own=1e5,
    )
    assert ranged in late and parse(f"{example('observed.slow')} {late}") is not None
    one = render("evidence.shift", rank=0, op="aten::mm", observed=2e6, normal=1e6, steps=1)
    assert one.endswith("for 1 step.") and parse(one) is not None
    assert parse(one.replace("1 step.", "1 steps.")) is None
    assert [format_share(v) for v in (1.4, 0.999, 0.5, 0.001)] == ["all", "all", "50%", "under 1%"]


def test_broken_text_and_families_out_of_order_do_not_parse():
    slow = example("observed.slow")
    cause = example("cause.straggler")
    assert parse(f"{slow} {cause}") is not None
    assert parse(f"{cause} {slow}") is None  # the cause before the observation
    assert parse(f"{slow} {slow}") is None  # one observation per explanation
    assert parse(slow.replace(" took ", " was throttled to takes ")) is None
    assert parse(f"{slow} It shows in aten::mm.") is None


# -- random heads over random facts -------------------------------------------------------------

OPERATORS = [
    "aten::mm",
    "gloo:all_reduce",
    "nn.Module: Qwen2ForCausalLM_0",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "cudaLaunchKernel",
]
REFERENCES = [
    "nearest-composition normal steps, same rank",
    "same operator on peer ranks, same step",
    NEW_OPERATOR,
    SUBSTITUTED,
    "same operator at the same place in the step's other 23 repeated layers; this is layer 5 of 24",
    "same operator on peer ranks, same step; shifted for 1 steps",
]


def _measured(rng) -> Measured | None:
    if rng.random() < 0.3:
        return None
    return Measured(float(rng.integers(1, 10**9)), float(rng.integers(0, 10**9)))


def _random_context(rng) -> StepContext:
    ranks = int(rng.choice([1, 2, 4]))
    rank = int(rng.integers(0, ranks))
    kinds = ["compute", "idle", "forward"] + (["shift", "arrival", "transfer"] if ranks > 1 else [])
    references = REFERENCES if ranks > 1 else [REFERENCES[0], NEW_OPERATOR, REFERENCES[4]]

    def candidate(on_rank: int) -> OperatorCandidate:
        kind = str(rng.choice(kinds))
        return OperatorCandidate(
            iteration=7,
            rank=on_rank,
            operator=str(rng.choice(OPERATORS)),
            score=float(rng.integers(0, 10**8)),
            observed_ns=int(rng.integers(1, 10**9)),
            normal_ns=int(rng.integers(0, 10**9)) if rng.random() < 0.8 else 0,
            z=5.0,
            node=1,
            reference=str(rng.choice(references)) if kind == "compute" else "vs normal",
            kind=kind,
        )

    top = candidate(rank) if rng.random() < 0.9 else None
    others = [candidate(int(rng.integers(0, ranks))) for _ in range(int(rng.integers(0, 4)))]
    late = None
    if ranks > 1 and top is not None and rng.random() < 0.6:
        count = int(rng.integers(1, 40))
        smallest = float(rng.integers(1, 10**9)) if rng.random() < 0.5 else None
        largest = None if smallest is None else smallest * float(rng.choice([1.0, 7.0]))
        late = LateArrivals(
            count=count,
            kind=str(rng.choice(["all-reduce", "all-gather", "collective"])),
            size_bytes=smallest,
            largest_bytes=largest,
            late_ns=float(rng.integers(1, 10**9)),
            usual_late_ns=float(rng.integers(0, 10**7)),
            waited_ns=float(rng.integers(1, 10**9)),
            own_ns=float(rng.integers(1, 10**9)),
        )
    expected = int(rng.integers(1, 10**9))
    unfinished = ranks > 1 and top is not None and rng.random() < 0.05
    return StepContext(
        iteration=7,
        kind=str(rng.choice(["decode", "prefill", "mixed", "profiler_step"])),
        step_dur_ns=int(rng.integers(1, 2 * 10**9)),
        expected_ns=expected,
        rank=top.rank if top is not None else None,
        rank_dur_ns=int(expected * rng.uniform(0.8, 10)),
        ranks=ranks,
        candidate=top,
        others=others,
        peers_ns=float(rng.integers(1, 10**9)) if ranks > 1 and rng.random() < 0.5 else None,
        peer_rank=(1 - rank if ranks == 2 else None),
        arrivals=late,
        host=_measured(rng),
        gpu=_measured(rng),
        idle=_measured(rng),
        transfer=_measured(rng) if ranks > 1 else None,
        context_tokens=(int(rng.integers(0, 4000)), int(rng.integers(1, 4000)))
        if rng.random() < 0.7
        else None,
        batch_tokens=(int(rng.integers(1, 4000)), 4000) if rng.random() < 0.7 else None,
        held_back=int(rng.integers(0, 12)) if rng.random() < 0.5 else None,
        has_logs=bool(rng.random() < 0.5),
        unfinished=unfinished,
    )


def test_random_head_outputs_always_give_explanations_of_plans_that_agree_with_the_heads():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        context = _random_context(rng)
        fault = str(rng.choice(FAULT_NAMES))
        scores = rng.normal(size=len(MECHANISMS)).tolist()
        mechanism = choose_mechanism(context, fault, scores)
        assert mechanism in allowed_mechanisms(context, fault)
        explanation = compose(context, fault, mechanism, state_cause=bool(rng.random() < 0.8))
        text = explanation.text
        said = parse(text)
        assert said is not None, text
        assert [s.plan for s in said] == list(explanation.plans)
        families = [FAMILIES.index(s.plan.split(".")[0]) for s in said]
        assert families == sorted(families)
        # the fault type it states is the fault head's
        stated = {PLANS[s.plan].fault for s in said} - {None}
        assert stated <= ({fault} if fault not in FAULT_FREE else set()), text
        # the rank it names is the pointer's, the operator the pointer's
        top = context.candidate
        for s in said:
            if "rank" in s.slots:
                assert top is not None and s.slots["rank"] == str(top.rank), text
            if "op" in s.slots:
                assert top is not None and s.slots["op"] == operator_text(top.operator), text
        if context.one_rank:
            assert "peers" not in text and "other ranks" not in text, text
        if mechanism != "none":
            assert mechanism in FAULT_MECHANISMS[fault]
        assert 0.0 <= explanation.explained_ns <= explanation.excess_ns + 1e-6


def _late_rank(own_ns: float, late_ns: float, transfer: Measured | None) -> StepContext:
    """Rank 0 of two, last at the step's all-reduces (the lab's throttled-link steps)."""
    top = OperatorCandidate(
        iteration=54,
        rank=0,
        operator="gloo:all_reduce",
        score=1.0,
        observed_ns=157_000_000,
        normal_ns=17_600_000,
        z=9.0,
        node=1,
        reference="vs normal",
        kind="transfer",
    )
    late = LateArrivals(14, "all-reduce", 8_190.0, 57_300.0, late_ns, 3.53e6, late_ns, own_ns)
    return StepContext(
        iteration=54,
        kind="mixed",
        step_dur_ns=253_000_000,
        expected_ns=69_600_000,
        rank=0,
        rank_dur_ns=253_000_000,
        ranks=2,
        candidate=top,
        arrivals=late,
        transfer=transfer,
    )


def test_a_straggler_is_not_said_to_cost_no_transfer_when_its_own_collective_time_dwarfs_it():
    rose = Measured(190e6, 30e6)
    throttled = compose(_late_rank(own_ns=190e6, late_ns=69.1e6, transfer=rose), "straggler")
    assert "cause.straggler_or_link" in throttled.plans, throttled.text
    assert "not transfer" not in throttled.text
    assert "its own 190 ms in those collectives is more than its 69.1 ms of late arrival" in (
        throttled.text
    )
    assert parse(throttled.text) is not None
    # a true straggler: little of its own time inside, or no rise in transfer
    for own, transfer in ((5e6, rose), (190e6, Measured(31e6, 30e6)), (190e6, None)):
        plain = compose(_late_rank(own_ns=own, late_ns=69.1e6, transfer=transfer), "straggler")
        assert "cause.straggler" in plain.plans and "not transfer" in plain.text


def test_host_counters_that_show_the_quota_tell_a_straggler_from_a_slow_link():
    """The slower-link caveat is for a rank the trace alone cannot tell apart; a CPU quota
    throttling it in the step says which it is, and the sentence then says its own long time in
    the collectives was held back with it rather than "not transfer" beside it."""
    late = _late_rank(own_ns=190e6, late_ns=69.1e6, transfer=Measured(190e6, 30e6))
    late.host_counters = {"throttled_ns": Measured(120e6, 0.0)}
    said = compose(late, "straggler")
    assert "cause.straggler_held" in said.plans and "host.throttled_ns" in said.plans, said.text
    assert (
        "its own 190 ms in those collectives, more than its 69.1 ms of late arrival, was held back"
        in said.text
    )
    assert "not transfer" not in said.text and parse(said.text) is not None
    # its own time there under its lateness: the plain straggler's sentence
    brief = _late_rank(own_ns=5e6, late_ns=69.1e6, transfer=Measured(190e6, 30e6))
    brief.host_counters = {"throttled_ns": Measured(120e6, 0.0)}
    assert "cause.straggler" in compose(brief, "straggler").plans


def test_a_straggler_named_by_its_own_share_of_a_collective_says_so():
    """A straggler's finding in a step it reached no collective late (its peer's re-pointed at
    its own time in the all-reduce) states that time and says it was not late there."""
    c = _late_rank(own_ns=2.86e6, late_ns=1.45e6, transfer=Measured(95e6, 20e6))
    c.rank = 1
    c.arrivals = None
    c.candidate = OperatorCandidate(
        70,
        1,
        "gloo:all_reduce",
        74.8e6,
        89_800_000,
        15_000_000,
        59.7,
        3,
        OWN_SHARE_REFERENCE,
        "transfer",
    )
    c.host_counters = {"throttled_ns": Measured(63.8e6, 0.0)}
    said = compose(c, "straggler")
    assert said.plans[1] == "evidence.own_share" and "cause.straggler_share" in said.plans
    assert "its own time in gloo:all_reduce was 89.8 ms against 15 ms normally" in said.text
    assert "the last to arrive" not in said.text and "not transfer" not in said.text
    assert parse(said.text) is not None


def test_a_stragglers_late_arrivals_are_a_share_of_what_its_peers_lost():
    """The straggler's own step (101 ms, 26.4 expected) ends with its last collective; its peers
    waited 133 ms for it, and their step took 168 ms: the late arrivals are a share of theirs,
    not "all of" the straggler's 74.6 ms."""
    late = LateArrivals(6, "all-reduce", 12_300.0, 65_500.0, 133e6, 0.76e6, 133e6, 6.52e6)
    top = OperatorCandidate(
        128, 1, "gloo:all_reduce", 66e6, 67_500_000, 952_000, 9.0, 4, "vs normal", "arrival"
    )
    c = replace(
        _late_rank(own_ns=6.52e6, late_ns=133e6, transfer=None),
        step_dur_ns=168_000_000,
        expected_ns=26_400_000,
        rank=1,
        rank_dur_ns=101_000_000,
        candidate=top,
        arrivals=late,
    )
    said = compose(c, "straggler", "late_arrival")
    assert "share.late_peers" in said.plans, said.text
    assert "are 93% of the step's 142 ms excess on its peers, which waited for it." in said.text
    assert said.explained_ns <= said.excess_ns == 141_600_000
    assert parse(said.text) is not None
    # late arrivals within the straggler's own excess are a share of it, as before
    c.step_dur_ns = c.rank_dur_ns = 250_000_000
    assert "share.late" in compose(c, "straggler", "late_arrival").plans


def _sampled_rank_late() -> StepContext:
    """Step 1 of HTA's two sampled ranks of a 128-rank job: rank 0 reached a send/recv 271 ms
    after its peer, where it was on time in the capture's other step, beside an excess of
    22.7 ms on its peer (the other step, its reference, had a straggler of its own)."""
    late = LateArrivals(4, "collective", 22.9e6, 1.07e9, 271e6, 0.0, 271e6, 180e6)
    top = OperatorCandidate(
        1, 0, "ncclKernel_SendRecv", 271e6, 271_000_000, 0, 9.0, 4, "", "arrival"
    )
    return replace(
        _late_rank(own_ns=180e6, late_ns=271e6, transfer=None),
        step_dur_ns=631_000_000,
        expected_ns=608_300_000,
        rank=0,
        rank_dur_ns=623_000_000,
        candidate=top,
        arrivals=late,
    )


def test_late_arrivals_far_beyond_the_steps_excess_exceed_it_instead_of_being_all_of_it():
    """In a capture of two steps, each with its own straggler, the step is compared with the
    other one: rank 0's 271 ms of late arrivals sit beside an excess of 22.7 ms on its peers.
    "are all of the step's 22.7 ms excess" would read as a slip; the text says they exceed it
    and that the rest of the step took less than expected (the excess is the sum of both)."""
    c = _sampled_rank_late()
    said = compose(c, "straggler", "late_arrival")
    assert "share.late_peers_beyond" in said.plans, said.text
    assert (
        "exceed the step's 22.7 ms excess on its peers, which waited for it; the rest of "
        "their step took less than expected." in said.text
    )
    assert "all of" not in said.text
    assert said.explained_ns <= said.excess_ns
    assert parse(said.text) is not None
    assert agreement(said.text, "straggler", None, 0).excess_explained == 1.0
    # within half again the excess, it is still "all of" it
    c.step_dur_ns = 608_300_000 + 200_000_000
    assert "share.late_peers" in compose(c, "straggler", "late_arrival").plans


def test_usually_on_time_is_said_once():
    """The evidence sentence has said the rank is usually on time at the collective; the
    late-arrival sentence after it says the total without saying it again."""
    c = _sampled_rank_late()
    said = compose(c, "straggler", "late_arrival")
    assert said.plans[1] == "evidence.arrival_first"
    assert "mechanism.late_arrival_first_said" in said.plans, said.text
    assert said.text.count("where it is usually on time") == 1
    assert parse(said.text) is not None


def test_a_link_fault_between_two_ranks_says_the_trace_cannot_tell_which_end():
    """Both ends of a two-rank link slow alike, so naming one end's link is a guess the text
    owns up to; with several peers the transfers of the guilty rank's link stand out alone."""
    two = _late_rank(own_ns=190e6, late_ns=9.15e6, transfer=Measured(1.71e9, 32.9e6))
    said = compose(two, "net_throttle")
    assert "caveat.link_ends" in said.plans and parse(said.text) is not None, said.text
    assert "rank 1" not in said.text  # the caveat names no other rank
    many = _late_rank(own_ns=190e6, late_ns=9.15e6, transfer=Measured(1.71e9, 32.9e6))
    many.ranks = 4
    many.rank_transfers = (1.71e9, 0.4e9)
    assert not {"caveat.link_ends", "caveat.link_alike"} & set(compose(many, "net_throttle").plans)
    assert "caveat.link_ends" not in compose(two, "straggler").plans


def test_a_link_fault_whose_ranks_transfers_are_alike_says_the_times_cannot_tell_the_end():
    """In a ring every member of a collective waits for its slowest link: where the named
    rank's own collective time is about its peers', the text says so with both times."""
    c = _late_rank(own_ns=190e6, late_ns=9.15e6, transfer=Measured(1.71e9, 32.9e6))
    c.ranks, c.rank_transfers = 3, (1.21e9, 1.2e9)
    said = compose(c, "net_throttle")
    assert "caveat.link_alike" in said.plans and parse(said.text) is not None, said.text
    assert "collectives took 1.21 s in this step and its peers' 1.2 s" in said.text
    assert "caveat.link_alike" not in compose(c, "straggler").plans


def test_a_slow_links_cause_quotes_its_collectives_by_size_only_where_they_agree():
    """The cause of a rate limit says its collectives grew with their size only with the
    measurement in the sentence, and a measurement that says otherwise (a delay's flat
    excess) is not quoted as a rate limit's: the type stands unexplained instead."""
    c = _late_rank(own_ns=190e6, late_ns=9.15e6, transfer=Measured(1.71e9, 32.9e6))
    c.rank = 0
    plain = compose(c, "net_throttle")
    assert "cause.net_throttle" in plain.plans and "size" not in plain.text
    c.link_growth = SizeGrowth(98_304, 786_432, 41e6, 312e6, (4_608, 98_304), (786_432, 786_432))
    sized = compose(c, "net_throttle")
    assert "cause.net_throttle_sized" in sized.plans and parse(sized.text) is not None
    assert "collectives of 786 kB took 312 ms longer than usual and those of 4.61 kB to " in (
        sized.text
    ), sized.text
    assert "cause.net_delay" in compose(c, "net_delay").plans  # it grew: no delay's numbers
    c.link_growth = SizeGrowth(98_304, 786_432, 5.0e6, 5.2e6, (4_608, 98_304), (786_432, 1e6))
    flat = compose(c, "net_delay")
    assert "cause.net_delay_sized" in flat.plans and "not in proportion" in flat.text
    assert "cause.net_throttle" in compose(c, "net_throttle").plans


def test_kv_pressure_states_the_preemptions_the_engine_logged_in_the_step():
    """With preemption lines aligned to the step, the cause says how many the engine logged;
    without any (or without logs), it states the type alone."""
    c = _late_rank(own_ns=190e6, late_ns=9.15e6, transfer=Measured(1.71e9, 32.9e6))
    c.preempted = 3
    said = compose(c, "kv_pressure")
    assert "cause.kv_pressure_logged" in said.plans and parse(said.text) is not None
    assert "the engine logged that it preempted 3 requests in this step" in said.text
    for none in (0, None):
        c.preempted = none
        assert "cause.kv_pressure" in compose(c, "kv_pressure").plans


def test_a_capped_schedulers_batch_sentence_states_the_requests_it_left_waiting():
    """With the run's queue known, the small-batch sentence says how many waiting requests the
    step had room for; without it, or with none held back, only the batch against the largest."""
    context = StepContext(
        iteration=150,
        kind="decode",
        step_dur_ns=43_900_000,
        expected_ns=26_100_000,
        rank=0,
        rank_dur_ns=43_900_000,
        ranks=2,
        candidate=None,
        batch_tokens=(1, 396),
        held_back=6,
    )
    text = compose(context, "scheduler_misconfig", "small_batches").text
    assert (
        "batched 1 token, against 396 tokens in the run's largest step, while 6 requests " in text
    )
    assert "mechanism.small_batches_queued" in compose(context, "scheduler_misconfig").plans
    for unknown in (None, 0):
        context.held_back = unknown
        plans = compose(context, "scheduler_misconfig", "small_batches").plans
        assert "mechanism.small_batches" in plans and "mechanism.small_batches_queued" not in plans
