"""The pointer's training target follows the scoring rule: the labelled operator where scoring
asks for it, the guilty rank's strongest candidate where it asks only for the rank."""

from __future__ import annotations

from teller.labels import CaseLabels
from teller.localize import OperatorCandidate
from teller.rca.dataset.targets import guilty_candidate


def labels(source: str, fault: str, view: str, operator: str | None) -> CaseLabels:
    return CaseLabels(
        case_id="c",
        source=source,
        fault=fault,
        view=view,
        guilty_rank=1,
        guilty_operator=operator,
        window_ns=None,
        steps=[3],
        intensity=0.7,
        seed=0,
        explanation="",
    )


def candidate(rank: int, operator: str, score: float) -> OperatorCandidate:
    return OperatorCandidate(3, rank, operator, score, 0, 0, 0.0, 0, "", "compute")


#: A throttled rank 1: its peer's matmul (the straggler's cost to it) ranks first, then rank 1's
#: own all-reduce and concatenation, and its matmul, which barely slowed, last.
CANDIDATES = [
    candidate(0, "aten::mm", 9e6),
    candidate(1, "gloo:all_reduce", 8e6),
    candidate(1, "aten::cat", 5e6),
    candidate(1, "aten::mm", 1e6),
]


def test_a_lab_cpu_fault_teaches_the_guilty_ranks_strongest_candidate_not_its_matmul() -> None:
    for fault in ("straggler", "cpu_contention"):
        view = "H" if fault == "straggler" else "V"
        assert guilty_candidate(CANDIDATES, labels("lab", fault, view, "aten::mm")) == 1


def test_a_lab_cpu_fault_never_teaches_the_peers_candidate() -> None:
    only_peer = [candidate(0, "aten::mm", 9e6), candidate(0, "aten::cat", 1e6)]
    assert guilty_candidate(only_peer, labels("lab", "straggler", "H", "aten::mm")) == -1


def test_a_labelled_operator_that_scoring_asks_for_is_still_the_target() -> None:
    assert guilty_candidate(CANDIDATES, labels("sim", "straggler", "H", "aten::mm")) == 3
    slow_op = labels("lab", "slow_operator", "V", "aten::cat")
    assert guilty_candidate(CANDIDATES, slow_op) == 2


def test_a_node_network_fault_teaches_a_rank_scoring_takes_for_the_labelled_one() -> None:
    """Two stages of TP 4 over four nodes of two: a delay on node 0 (ranks 0 and 1) shows alike
    on either of them, not on node 1's ranks of the same ring (they send to other peers)."""
    delayed = labels("sim", "net_delay", "H", "nccl_send")
    delayed.guilty_rank = 0
    delayed.params = {"topology": {"nodes": 4, "gpus_per_node": 2, "tp": 4, "pp": 2}}
    others = [candidate(2, "nccl_send", 9e6), candidate(1, "nccl_send", 5e6)]
    assert guilty_candidate(others, delayed) == 1  # rank 1, not node 1's rank 2
    assert guilty_candidate([*others, candidate(0, "nccl_send", 1e6)], delayed) == 2
    # scoring asks for the rank: another node's candidate is no target
    assert guilty_candidate(others[:1], delayed) == -1
    # a vertical fault's operator is scored without its rank: the operator anywhere
    throttled = labels("sim", "gpu_throttle", "V", "nccl_send")
    assert guilty_candidate(others[:1], throttled) == 0
