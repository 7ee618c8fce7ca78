"""Where the time went on a simulated 2-rank case with host CPU contention on rank 1 in steps
5–24 (tests/report/conftest.py): the starved rank's GPU idles with its host busy, and its peer's
GPU sits in an exposed all-reduce waiting for it — the two sides of one fault."""

from __future__ import annotations

from teller.analysis import Analysis
from teller.callchain.breakdown import StepBreakdown

FAULT_STEPS = range(5, 22)  # the contention window, less the steps its end blurs
CLEAN_STEPS = range(0, 5)


def _share(breakdown: StepBreakdown, ns: int) -> float:
    return ns / breakdown.span_ns


def test_contended_rank_idles_on_its_host_while_its_peer_waits_in_communication(
    contention_analysis: Analysis,
):
    breakdown = contention_analysis.breakdown()
    assert [run.rank for run in breakdown.runs] == [0, 1]
    for b in [*breakdown.runs, *breakdown.steps]:
        assert b.busy.busy_ns + b.idle_ns == b.span_ns
        assert b.idle.idle_ns == b.idle_ns
        assert max(b.busy.compute_ns, b.busy.communication_ns, b.busy.memory_ns) <= b.busy.busy_ns
    for step in FAULT_STEPS:
        starved, peer = breakdown.step(1, step), breakdown.step(0, step)
        assert _share(starved, starved.idle.host_ns) > 0.8
        assert _share(peer, peer.busy.exposed_communication_ns) > 0.5
    for step in CLEAN_STEPS:
        peer = breakdown.step(0, step)
        assert _share(peer, peer.busy.exposed_communication_ns) < 0.1
    nccl = breakdown.run(0).top_kernels[0]
    assert nccl.kind == "communication" and nccl.name.startswith("ncclKernel_AllReduce")
