"""Request-scoped log lines on their request and step, scored against a simulated case's ground truth.

The simulator knows which request ran in which step and which step each log line is about
(`ground_truth/lines.jsonl`, see teller.lab.sim.logs.GroundTruth), so a kv_pressure case, whose
requests are received, added, preempted, resumed and finished, scores alignment line by line. The
case is aligned as a user would: `Analysis(case)`, which reads the logs and the OTLP spans beside
the traces, and again with the spans taken away (logs alone).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from teller.analysis import Analysis
from teller.ingest.logs import request_key
from teller.lab.sim import FaultSpec, SimConfig, Topology, WorkloadConfig, simulate

REQUEST_EVENTS = (
    "request_received",
    "request_added",
    "request_preempted",
    "request_resumed",
    "request_finished",
    "request_aborted",
)


@pytest.fixture(scope="module")
def kv_case(tmp_path_factory) -> Path:
    case = tmp_path_factory.mktemp("sim-align") / "kv"
    config = SimConfig(
        Topology(1, 2, 2, 1),
        steps=120,
        layers=8,
        python_frames=False,
        workload=WorkloadConfig(output_median=32),
        fault=FaultSpec("kv_pressure", intensity=2.0, window=(20, 120)),
        seed=5,
    )
    simulate(config, case)
    return case


@pytest.fixture(scope="module", params=["spans", "logs only"])
def scored(request, kv_case, tmp_path_factory) -> list[tuple[dict, dict]]:
    """(aligned log row, ground-truth row) for every log line of a kv_pressure case, aligned with
    its OTLP spans and from its logs alone."""
    case = kv_case
    if request.param == "logs only":
        case = tmp_path_factory.mktemp("sim-align-logs") / "kv"
        shutil.copytree(kv_case, case, ignore=shutil.ignore_patterns("otlp"))
    truth = {}
    for line in (case / "ground_truth" / "lines.jsonl").open():
        row = json.loads(line)
        truth[(row["log"], row["line"])] = row
    rows = Analysis(case).logs().to_pylist()
    return [
        (row, truth[(Path(row["file"]).relative_to(case).as_posix(), row["line"])]) for row in rows
    ]


def request_lines(scored: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    return [(row, truth) for row, truth in scored if row["event"] in REQUEST_EVENTS]


def test_lines_of_requests_no_step_admitted_stay_off_every_step(scored):
    """Requests still queued when the trace ended: their Received/Added lines are `queued`."""
    queued = [(row, truth) for row, truth in request_lines(scored) if truth["step"] is None]
    assert len(queued) >= 10
    assert all(row["method"] == "queued" and row["step"] == -1 for row, _ in queued)


def on_its_step(row: dict, truth: dict) -> bool:
    """The line joined the step it is about (-1 when that request never ran in the trace)."""
    return row["step"] == (-1 if truth["step"] is None else truth["step"])


def test_the_case_prints_every_kind_of_request_line(scored):
    kinds = Counter(row["event"] for row, _ in request_lines(scored))
    for event in REQUEST_EVENTS[:5]:
        assert kinds[event] >= 10, kinds


def test_every_request_line_names_its_request(scored):
    for row, truth in request_lines(scored):
        assert row["request_key"] == request_key(truth["request_id"]), row["raw"]


def test_finished_preempted_and_resumed_lines_land_on_their_steps(scored):
    for event in ("request_finished", "request_preempted", "request_resumed"):
        lines = [(row, truth) for row, truth in request_lines(scored) if row["event"] == event]
        right = sum(on_its_step(row, truth) for row, truth in lines)
        assert right >= 0.99 * len(lines), (event, right, len(lines))


def test_99_percent_of_request_lines_land_on_their_request_and_step(scored):
    lines = request_lines(scored)
    right = sum(
        row["request_key"] == request_key(truth["request_id"]) and on_its_step(row, truth)
        for row, truth in lines
    )
    assert right >= 0.99 * len(lines), f"{right} of {len(lines)}"


@pytest.mark.parametrize("fault", ["scheduler_misconfig", "kv_pressure"])
def test_the_waiting_queue_is_the_simulators_step_by_step(fault: str) -> None:
    """`RequestTrees.waiting`: requests arrived and not yet admitted at each step's start, from
    the logs alone, against the simulator's own record of arrivals and admissions; a misconfigured
    scheduler keeps requests queued where the fault-free run has drained them."""
    from lab.test_sim_cases import WINDOW, case
    from teller.align.align import align_tree

    def queues(fault: str) -> tuple[dict[int, int], dict[int, int]]:
        out, _, tree = case(fault=fault, rank=0)
        waiting = align_tree(tree, sorted((out / "logs").glob("*.log"))).requests.waiting(tree)
        truth = out / "ground_truth"
        arrivals = [json.loads(line) for line in (truth / "requests.jsonl").open()]
        steps = [json.loads(line) for line in (truth / "steps.jsonl").open()]
        admitted: dict[str, int] = {}
        for step in steps:
            for request in step["requests"]:
                admitted.setdefault(request["request_id"], step["step"])
        expected = {
            step["step"]: sum(
                r["arrival_ns"] <= step["start_ns"]
                and admitted.get(r["request_id"], len(steps)) > step["step"]
                for r in arrivals
            )
            for step in steps
        }
        return waiting, expected

    waiting, expected = queues(fault)
    assert waiting == expected
    assert max(expected.values()) > 0
    if fault == "scheduler_misconfig":
        late_window = range(WINDOW[1] - 5, WINDOW[1])
        normal, _ = queues("none")
        assert all(waiting[s] >= 5 for s in late_window)
        assert all(normal[s] == 0 for s in late_window)


def test_requests_no_traced_step_served_are_not_a_queue() -> None:
    """A capture taken from a running service logs the finish of requests whose admission came
    before it (arrival unknown) and serves some requests wholly between two captures; neither
    kind waits at any traced step, or every step of the capture shows a queue the scheduler
    never had (and reads as a capped scheduler)."""
    import dataclasses

    import numpy as np

    from lab.test_sim_cases import case
    from teller.align.align import align_tree

    out, _, tree = case(fault="none", rank=0)
    trees = align_tree(tree, sorted((out / "logs").glob("*.log"))).requests
    before = trees.waiting(tree)
    requests = trees.requests
    start = int(tree.steps.start_ns.min())
    end = int(tree.steps.start_ns.max())
    extra = {  # finished before the capture's end, admitted by no traced step
        "key": ["admitted-before-the-capture", "served-between-captures"],
        "arrival_ns": [-1, start + 1],
        "scheduled_ns": [-1, -1],
        "first_token_ns": [-1, -1],
        "finish_ns": [start + 2, start + 3],
        "exact": [True, True],
        "source": ["logs", "logs"],
    }
    grown = dataclasses.replace(
        requests,
        **{
            name: (
                getattr(requests, name) + values
                if isinstance(values[0], str)
                else np.concatenate([getattr(requests, name), np.asarray(values)])
            )
            for name, values in extra.items()
        },
    )
    assert end > start + 3
    assert dataclasses.replace(trees, requests=grown).waiting(tree) == before
