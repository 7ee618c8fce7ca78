"""Which ranks a fault's trace cannot tell apart, from the labels the simulator and lab write."""

from __future__ import annotations

from teller.labels import (
    CaseLabels,
    equivalent_operators,
    equivalent_ranks,
    rank_scored,
    scored_operator,
)


def labels(fault: str, view: str, rank: int, **params) -> CaseLabels:
    return CaseLabels(
        case_id="c",
        source="sim",
        fault=fault,
        view=view,
        guilty_rank=rank,
        guilty_operator="op",
        window_ns=None,
        steps=[1],
        intensity=1.0,
        seed=0,
        explanation="",
        params=params,
    )


def topology(nodes: int, per_node: int) -> dict:
    return {"nodes": nodes, "gpus_per_node": per_node, "tp": nodes * per_node, "pp": 1}


def test_a_node_network_fault_on_two_nodes_slows_the_same_links_from_either_node() -> None:
    for fault in ("net_delay", "bandwidth_throttle"):
        assert equivalent_ranks(labels(fault, "H", 2, topology=topology(2, 2))) == {0, 1, 2, 3}


def test_every_node_a_ring_crosses_is_equivalent() -> None:
    """A ring all-reduce runs at its slowest hop's pace, wherever the hop is."""
    assert equivalent_ranks(labels("net_delay", "H", 5, topology=topology(4, 2))) == set(range(8))


def test_across_pipeline_stages_only_the_nodes_with_the_same_sends_are_equivalent() -> None:
    # two stages of tp 4 over four nodes of 2: nodes 0 and 1 share the stage-0 ring, but node 0
    # sends ranks 0 and 1 to 4 and 5, node 1 ranks 2 and 3 to 6 and 7
    two_stages = {"nodes": 4, "gpus_per_node": 2, "tp": 4, "pp": 2}
    assert equivalent_ranks(labels("net_delay", "H", 0, topology=two_stages)) == {0, 1}
    # one node per stage: each node's sends are its own
    per_stage = {"nodes": 8, "gpus_per_node": 8, "tp": 8, "pp": 4}
    assert equivalent_ranks(labels("net_delay", "H", 44, topology=per_stage)) == set(range(40, 48))


def test_link_contention_names_either_end_of_the_link() -> None:
    assert equivalent_ranks(labels("link_contention", "H", 1, peer=2)) == {1, 2}


def test_link_contention_names_any_rank_of_the_links_ring() -> None:
    two_stages = {"nodes": 2, "gpus_per_node": 4, "tp": 4, "pp": 2}
    found = equivalent_ranks(labels("link_contention", "H", 5, peer=6, topology=two_stages))
    assert found == {4, 5, 6, 7}


def test_a_two_rank_lab_throttle_shapes_the_only_link() -> None:
    assert equivalent_ranks(labels("net_throttle", "H", 0, tp=2)) == {0, 1}
    assert equivalent_ranks(labels("net_throttle", "H", 0, tp=4)) == {0}


def test_other_faults_keep_their_one_rank() -> None:
    assert equivalent_ranks(labels("straggler", "H", 3, topology=topology(2, 2))) == {3}
    assert equivalent_ranks(labels("gpu_throttle", "V", 1)) == {1}


def test_a_busy_hosts_launches_go_by_either_launch_call() -> None:
    contended = labels("host_cpu_contention", "V", 1)
    contended.guilty_operator = "cudaLaunchKernel"
    assert equivalent_operators(contended) == {"cudaLaunchKernel", "cudaGraphLaunch"}
    assert equivalent_operators(labels("gpu_throttle", "V", 1)) == {"op"}
    none = labels("scheduler_misconfig", "V", 1)
    none.guilty_operator = None
    assert equivalent_operators(none) == frozenset()


def test_a_lab_cpu_fault_is_scored_by_its_rank_not_an_operator() -> None:
    """A CPU quota or a busy core stalls whichever operator runs when the CPU is taken: the
    lab's straggler and CPU contention are right with the rank, the simulator's keep their
    operator (it slows one), and an engine-wide fault asks for neither."""
    for fault, view in (("straggler", "H"), ("cpu_contention", "V")):
        lab = labels(fault, view, 1)
        lab.source = "lab"
        assert scored_operator(lab) is None and rank_scored(lab)
    simulated = labels("straggler", "H", 1)
    assert scored_operator(simulated) == "op" and rank_scored(simulated)
    assert scored_operator(labels("gpu_throttle", "V", 1)) == "op"
    assert not rank_scored(labels("gpu_throttle", "V", 1))
    stall = labels("host_stall", "V", 1)
    stall.guilty_operator = None
    assert rank_scored(stall)
    misconfigured = labels("scheduler_misconfig", "V", 0)
    misconfigured.guilty_operator = None
    assert not rank_scored(misconfigured)
