"""Metrics against hand-computed examples, edge cases included."""

from __future__ import annotations

import pytest

from teller.eval.metrics import (
    PRF,
    Candidate,
    StepTruth,
    StepVerdict,
    accuracy_at_k,
    agreement,
    average_at_k,
    false_alarm_rate,
    joint_prf,
    lcs_length,
    names_exactly,
    position_of,
    rank_accuracy_at_1,
    rouge_l,
    step_prf,
    word_tokens,
)


def test_step_prf_by_hand() -> None:
    # truth {1,2,3,4}; flagged {3,4,5}: 2 hits, P=2/3, R=2/4, F1=2*(2/3*1/2)/(2/3+1/2)=4/7
    result = step_prf({1, 2, 3, 4}, {3, 4, 5})
    assert (result.true_positives, result.flagged, result.positives) == (2, 3, 4)
    assert result.precision == pytest.approx(2 / 3)
    assert result.recall == pytest.approx(0.5)
    assert result.f1 == pytest.approx(4 / 7)


def test_step_prf_edge_cases() -> None:
    assert step_prf(set(), set()) == PRF(1.0, 1.0, 1.0, 0, 0, 0)  # nothing to find, nothing claimed
    no_positives = step_prf(set(), {1})
    assert (no_positives.precision, no_positives.recall, no_positives.f1) == (0.0, 0.0, 0.0)
    all_found = step_prf({1, 2}, {1, 2})
    assert all_found.f1 == 1.0
    nothing_flagged = step_prf({1, 2}, set())
    assert (nothing_flagged.precision, nothing_flagged.recall) == (0.0, 0.0)


def test_accuracy_at_k_and_average() -> None:
    ranked = [
        [Candidate("mm", 3.0), Candidate("add", 2.0), Candidate("softmax", 1.0)],  # guilty mm @1
        [
            Candidate("mm", 3.0),
            Candidate("add", 2.0),
            Candidate("softmax", 1.0),
        ],  # guilty softmax @3
        [Candidate("mm", 3.0)],  # guilty absent
    ]
    guilty = ["mm", "softmax", "silu"]
    assert accuracy_at_k(ranked, guilty, 1) == pytest.approx(1 / 3)
    assert accuracy_at_k(ranked, guilty, 3) == pytest.approx(2 / 3)
    # AC@1..5 = 1/3, 1/3, 2/3, 2/3, 2/3 -> mean 8/15
    assert average_at_k(ranked, guilty, 5) == pytest.approx(8 / 15)
    assert accuracy_at_k([], [], 1) == 0.0


def test_ties_count_pessimistically() -> None:
    tied = [Candidate("a", 1.0), Candidate("b", 1.0), Candidate("c", 1.0)]
    assert position_of(tied, "a") == 3
    assert accuracy_at_k([tied], ["a"], 1) == 0.0
    assert accuracy_at_k([tied], ["a"], 3) == 1.0
    assert (
        rank_accuracy_at_1([[Candidate("x", 1.0, rank=0), Candidate("x", 1.0, rank=1)]], [0]) == 0.0
    )


def test_rank_accuracy_at_1() -> None:
    ranked = [
        [Candidate("ar", 2.0, rank=1), Candidate("ar", 1.0, rank=0)],
        [Candidate("ar", 2.0, rank=0)],
    ]
    assert rank_accuracy_at_1(ranked, [1, 1]) == 0.5


def test_joint_prf_needs_step_operator_and_rank_for_horizontal() -> None:
    truths = [
        StepTruth("s1", True, "mm", 0, horizontal=False),
        StepTruth("s2", True, "allreduce", 1, horizontal=True),
        StepTruth("s3", True, "allreduce", 1, horizontal=True),
        StepTruth("s4", False),
    ]
    verdicts = [
        StepVerdict("s1", True, "mm", 3),  # vertical: rank not required -> hit
        StepVerdict("s2", True, "allreduce", 1),  # hit
        StepVerdict("s3", True, "allreduce", 0),  # wrong rank -> not a hit
        StepVerdict("s4", True, "mm", 0),  # false alarm
    ]
    result = joint_prf(truths, verdicts)
    assert (result.true_positives, result.flagged, result.positives) == (2, 4, 3)
    assert result.f1 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


def test_false_alarm_rate() -> None:
    assert false_alarm_rate([StepVerdict(i, i == 0) for i in range(50)]) == pytest.approx(0.02)
    assert false_alarm_rate([]) == 0.0


def test_word_tokens_lower_case_and_split_on_punctuation() -> None:
    assert word_tokens("Rank 1's aten::mm (3.2 ms)") == [
        "rank",
        "1",
        "s",
        "aten",
        "mm",
        "3",
        "2",
        "ms",
    ]
    assert word_tokens("") == []


def test_lcs_length_by_hand() -> None:
    assert lcs_length(list("abcbdab"), list("bdcaba")) == 4  # the textbook pair: "bcba"
    assert lcs_length(["a"], []) == 0
    assert lcs_length([], []) == 0


def test_rouge_l_by_hand() -> None:
    # candidate: the gpu is slow (4); reference: the gpu on rank 1 is slow (7)
    # LCS "the gpu is slow" = 4: P = 4/4, R = 4/7, F = 2·1·(4/7)/(1 + 4/7) = 8/11
    assert rouge_l("The GPU is slow.", "the gpu on rank 1 is slow") == pytest.approx(8 / 11)
    assert rouge_l("Rank 1 stalls.", "rank 1 stalls") == 1.0  # case and punctuation do not count
    # order matters: LCS of "b a" and "a b" is 1, P = R = 1/2, F = 1/2
    assert rouge_l("b a", "a b") == pytest.approx(0.5)
    assert rouge_l("nothing shared", "rank 1 stalls") == 0.0


def test_rouge_l_with_empty_strings_is_zero() -> None:
    assert rouge_l("", "rank 1 stalls") == 0.0
    assert rouge_l("rank 1 stalls", "") == 0.0
    assert rouge_l("", "") == 0.0
    assert rouge_l("...", "rank 1") == 0.0  # punctuation only: no tokens


def test_names_exactly_the_picked_operator_and_rank() -> None:
    text = "Rank 1's CPU is contended: aten::mm stretches (3 ms vs 1 ms normal)."
    assert names_exactly(text, "aten::mm", 1)
    assert not names_exactly(text, "aten::mm", 0)  # names rank 1, picked rank 0
    assert not names_exactly(text, "aten::addmm", 1)  # another operator
    assert not names_exactly("Rank 1 and rank 2 stall around aten::mm.", "aten::mm", 1)
    assert names_exactly("GPU 2 is power-capped, led by aten::mm.", "aten::mm", 2)
    assert not names_exactly("The scheduler's token budget is too small.", "aten::mm", 1)
    # digits in the operator's own name are not a rank
    assert names_exactly("On rank 0 nccl:rank 3 ring became slower.", "nccl:rank 3 ring", 0)
    # nothing picked: faithful when it names no rank
    assert names_exactly("Step 4 is slower than its batch predicts.", None, None)
    assert not names_exactly("Rank 4 is slow.", None, None)


def test_a_rank_the_trace_cannot_tell_from_the_guilty_one_counts() -> None:
    truths = [
        StepTruth("s1", True, "allreduce", 0, horizontal=True, equivalent_ranks=frozenset({0, 1})),
        StepTruth("s2", True, "allreduce", 0, horizontal=True, equivalent_ranks=frozenset({0, 1})),
    ]
    verdicts = [StepVerdict("s1", True, "allreduce", 1), StepVerdict("s2", True, "allreduce", 2)]
    assert joint_prf(truths, verdicts).true_positives == 1
    ranked = [[Candidate("ar", 2.0, rank=1)], [Candidate("ar", 2.0, rank=2)]]
    assert rank_accuracy_at_1(ranked, [{0, 1}, {0, 1}]) == 0.5


def test_an_operator_name_as_right_as_the_labelled_one_counts() -> None:
    launches = frozenset({"cudaLaunchKernel", "cudaGraphLaunch"})
    truths = [
        StepTruth("s1", True, "cudaLaunchKernel", 1, equivalent_operators=launches),
        StepTruth("s2", True, "cudaLaunchKernel", 1, equivalent_operators=launches),
    ]
    verdicts = [StepVerdict("s1", True, "cudaGraphLaunch", 1), StepVerdict("s2", True, "gemm", 1)]
    assert joint_prf(truths, verdicts).true_positives == 1
    ranked = [Candidate("gemm", 3.0), Candidate("cudaGraphLaunch", 2.0)]
    assert position_of(ranked, launches) == 2
    assert position_of(ranked, "cudaLaunchKernel") is None
    assert accuracy_at_k([ranked], [launches], 2) == 1.0


def test_a_fault_scored_by_its_rank_needs_the_rank_and_no_operator() -> None:
    truths = [
        StepTruth("s1", True, None, 1, rank_scored=True),
        StepTruth("s2", True, None, 1, rank_scored=True),
        StepTruth("s3", True, None, 1),
    ]
    verdicts = [
        StepVerdict("s1", True, None, 1),
        StepVerdict("s2", True, None, 0),
        StepVerdict("s3", True, None, 0),
    ]
    assert joint_prf(truths, verdicts).true_positives == 2


def test_agreement_reads_the_plans_fault_rank_and_operator() -> None:
    from teller.rca.plans import BASIS_BATCH, example, render

    observed = render(
        "observed.slow", step=3, kind="decode", dur=9e6, rank=1, expected=3e6, basis=BASIS_BATCH
    )
    evidence = render(
        "evidence.temporal_peer",
        rank=1,
        op="aten::mm",
        observed=6e6,
        normal=1e6,
        peers=1e6,
        peer_rank=0,
    )
    share = render("share.excess", op="aten::mm", rank=1, named=5e6, share=5 / 6, excess=6e6)
    text = " ".join([observed, evidence, render("cause.cpu_contention", rank=1), share])
    said = agreement(text, "cpu_contention", "aten::mm", 1)
    assert said.agrees and said.excess_explained == pytest.approx(0.83)
    assert names_exactly(text, "aten::mm", 1)  # rank 0 is named only as the peer it is
    assert not agreement(text, "straggler", "aten::mm", 1).fault
    assert not agreement(text, "cpu_contention", "aten::mm", 0).rank
    assert not agreement(text, "cpu_contention", "aten::bmm", 1).operator
    assert not agreement(
        text + " It shows in aten::mm.", "cpu_contention", "aten::mm", 1
    ).well_formed
    # the rise of the operator the rest went to (its time against its normal, as printed) adds
    # to the pointed node's share, capped at all of it
    rest = example("share.rest_operator")  # under 1% + (372 ms - 4.74 ms) / 454 ms
    assert agreement(rest, None, None, None).excess_explained == pytest.approx(
        0.005 + (372 - 4.74) / 454
    )
    # a mechanism's rise already holds the time its rank lost in the other operator
    rise = example("share.rise_rest_operator")
    assert agreement(rise, None, None, None).excess_explained == pytest.approx(0.81)
