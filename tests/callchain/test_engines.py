"""Several engines in one run: ranks grouped by the steps their annotations name, each engine's
steps numbered apart and compared only with its own ranks'."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from builders import two_tp2_replicas
from conftest import real_trace
from teller.analysis import Analysis
from teller.callchain.engines import group_ranks, same_engine, step_base
from teller.callchain.tree import build_tree
from teller.ingest import read_run
from teller.labels import CaseLabels

SAMPLED = ("hta/sampled_rank0_of128.json.gz", "hta/sampled_rank1_of128.json.gz")
RESNET = "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz"
RESOLVER = "hta/df_index_resolver_rank1_of2_216k_events.json.gz"


def vllm_names(batches: list[tuple[int, int]]) -> list[str]:
    return [f"execute_context_{c}({c * 100})_generation_{g}({g})" for c, g in batches]


def test_ranks_naming_the_same_batches_are_one_engine() -> None:
    batches = [(1, 4), (0, 5), (0, 5), (2, 3), (0, 6), (0, 6)]
    other = [(0, 2), (1, 2), (0, 3), (0, 3), (1, 3), (0, 4)]
    rank = np.repeat(np.arange(4), len(batches))
    names = vllm_names(batches) * 2 + vllm_names(other) * 2
    assert group_ranks(rank, names) == {0: 0, 1: 0, 2: 1, 3: 1}


def test_names_that_state_no_batch_keep_one_engine() -> None:
    steps = [f"ProfilerStep#{n}" for n in range(5, 15)]
    assert same_engine(steps, steps)
    assert same_engine(steps[:3], [f"ProfilerStep#{n}" for n in range(90, 93)])  # too few to tell
    assert not same_engine(steps, [f"ProfilerStep#{n}" for n in range(90, 100)])
    assert step_base(999) == 1000 and step_base(1000) == 10000


def test_real_ranks_of_one_job_stay_one_engine() -> None:
    tree = build_tree(read_run([real_trace(p) for p in SAMPLED]))
    assert sorted(set(tree.steps.rank.tolist())) == [0, 1]
    assert set(tree.steps.engine.tolist()) == {0}
    assert not any("engines in one run" in w for w in tree.warnings)


def test_real_captures_of_two_jobs_are_two_engines() -> None:
    """Two real captures of different jobs read as one run: their steps are not the same
    iterations, so neither their steps nor their collectives are joined."""
    tree = build_tree(read_run([real_trace(RESNET), real_trace(RESOLVER)]))
    steps = tree.steps
    assert sorted(set(zip(steps.rank.tolist(), steps.engine.tolist(), strict=True))) == [
        (0, 0),
        (1, 1),
    ]
    assert steps.index[steps.rank == 0].max() < 1000 <= steps.index[steps.rank == 1].min()
    assert [w for w in tree.warnings if "2 engines in one run" in w]
    assert steps.step_ids(1, [0, 3]) == [1000, 1003] and steps.step_ids(0, [3]) == [3]
    for instance in np.unique(tree.comm.instance):
        assert len(set(tree.comm.rank[tree.comm.instance == instance].tolist())) == 1


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_tp2_replicas(tmp_path_factory.mktemp("replicas") / "case")


def test_a_fault_in_the_second_engine_is_found_there(two_replicas: Path) -> None:
    run = Analysis(two_replicas, method="localizer")
    labels = CaseLabels.read(two_replicas).keyed_to(run.tree.steps)
    assert labels.steps == list(range(1012, 1018))
    findings = run.diagnose().findings
    flagged = {f.step for f in findings}
    assert set(labels.steps) <= flagged
    assert not flagged & set(range(12, 18))  # engine 0's steps of the same numbers ran normally
    named = [f for f in findings if f.step in labels.steps and f.rank == 3]
    assert len(named) >= 4 and all(f.operator.startswith("sm90_xmma_gemm") for f in named)


def test_each_engines_iteration_lines_land_on_its_own_steps(two_replicas: Path) -> None:
    """`Engine 00k: Iteration(n)` stats lines anchor to engine k's step n, on its ranks."""
    import re

    run = Analysis(two_replicas, method="localizer")
    placed = run.alignment.alignment
    raws = run.alignment.logs.table.column("raw").to_pylist()
    seen = {0: 0, 1: 0}
    for i, raw in enumerate(raws):
        found = re.search(r"Engine 00(\d): Iteration\((\d+)\)", raw or "")
        if not found:
            continue
        engine, iteration = int(found.group(1)), int(found.group(2))
        if iteration >= 30:  # past the traced steps
            continue
        assert placed.method[i] == "iteration"
        assert placed.step[i] == engine * 1000 + iteration
        assert placed.rank[i] in ((0, 1) if engine == 0 else (2, 3))
        seen[engine] += 1
    assert seen[0] >= 25 and seen[1] >= 25
    assert not any("doubtful" in w for w in run.alignment.warnings)


def test_the_step_chart_gives_each_engines_ranks_their_own_axis() -> None:
    from teller.report.charts import StepPoint, steps_spec

    def points(rank: int, first: int) -> list[StepPoint]:
        return [StepPoint(rank, first + s, "decode", 1.0, 1.0, False) for s in range(5)]

    one = steps_spec(points(0, 0) + points(1, 0) + points(10, 1))  # rank 10 cut a step short
    assert one["resolve"]["scale"] == {"y": "independent"}
    assert one["spec"]["layer"][0]["encoding"]["x"]["scale"]["domain"] == [-0.5, 5.5]
    two = steps_spec(points(0, 0) + points(1, 0) + points(2, 1000) + points(3, 1000))
    assert two["resolve"]["scale"] == {"y": "independent", "x": "independent"}
    assert "domain" not in two["spec"]["layer"][0]["encoding"]["x"]["scale"]
    assert two["facet"]["row"]["sort"] == {"field": "rank_number", "op": "min"}


def test_each_engines_requests_ride_its_own_steps(two_replicas: Path) -> None:
    """A replica's console (its API server's request lines beside its engine's) puts its
    requests on its engine's steps."""
    run = Analysis(two_replicas, method="localizer")
    requests = run.alignment.requests
    table = run.alignment.logs.table
    files = table.column("file").to_pylist()
    keys = table.column("request_key").to_pylist()
    engine_of = {}
    for file, key in zip(files, keys, strict=True):
        if key is not None:
            engine_of[key] = 0 if file.endswith("server0.log") else 1
    attached = {0: 0, 1: 0}
    for key, engine in engine_of.items():
        steps = requests.steps_of(key)
        assert all((s >= 1000) == (engine == 1) for s in steps), key
        attached[engine] += bool(steps)
    assert attached[0] >= 10 and attached[1] >= 10
