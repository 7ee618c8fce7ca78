"""A run's facts are computed once and shared: the localizer, the model's records and the
baselines read the same `RunFacts`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import teller.callchain.facts as facts_module
from builders import write_run
from conftest import real_trace
from teller.callchain.facts import RunFacts
from teller.callchain.tree import build_tree
from teller.ingest import read_run
from teller.localize import NumericLocalizer
from teller.rca.dataset import case_records


@pytest.fixture
def straggler(tmp_path: Path):
    """Two ranks; rank 0 reaches step 5's all-reduce 400 µs after rank 1."""
    return build_tree(read_run(write_run(tmp_path, late={(0, 5): 400})))


@pytest.fixture
def arrivals_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every call of the arrivals builder, counted."""
    calls: list[object] = []
    build = facts_module.arrivals_of

    def counted(tree):
        calls.append(tree)
        return build(tree)

    monkeypatch.setattr(facts_module, "arrivals_of", counted)
    return calls


def test_a_localizer_score_computes_the_arrivals_once(straggler, arrivals_calls) -> None:
    NumericLocalizer().score(straggler)
    assert len(arrivals_calls) == 1


def test_case_records_compute_the_arrivals_once(straggler, arrivals_calls) -> None:
    case_records(straggler, "straggler")
    assert len(arrivals_calls) == 1


def test_shared_facts_serve_a_localizer_score_and_the_records(straggler, arrivals_calls) -> None:
    facts = RunFacts(straggler)
    alone = NumericLocalizer().score(straggler)
    arrivals_calls.clear()
    shared = NumericLocalizer().score(straggler, facts)
    case_records(straggler, "straggler", facts=facts)
    assert len(arrivals_calls) == 1
    assert shared == alone


def test_facts_of_another_tree_are_refused(straggler, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other = build_tree(read_run(write_run(tmp_path / "other")))
    with pytest.raises(ValueError):
        RunFacts.of(straggler, RunFacts(other))


def test_the_arrivals_name_the_late_rank(straggler) -> None:
    arrivals = RunFacts(straggler).arrivals
    assert arrivals is not None
    late = arrivals.late_ns > 100_000
    assert arrivals.iteration[late].tolist() == [5]
    assert arrivals.rank[late].tolist() == [0]
    assert arrivals.is_last[late].all()


def test_iterations_take_the_slowest_rank_and_list_the_ranks(straggler) -> None:
    iterations = RunFacts(straggler).iterations
    steps = straggler.steps
    assert iterations.iteration.tolist() == sorted(set(steps.index.tolist()))
    for i, iteration in enumerate(iterations.iteration.tolist()):
        rows = steps.index == iteration
        assert iterations.dur_ns[i] == steps.dur_ns[rows].max()
        assert iterations.ranks[i] == [0, 1]


def test_host_work_without_waits_leaves_out_the_waiting_calls(straggler) -> None:
    work = RunFacts(straggler).work
    assert np.all(work.host_without_waits_ns <= work.host_ns)
    assert work.host_ns.sum() > 0


def test_row_index_finds_what_a_mask_selects() -> None:
    rng = np.random.default_rng(0)
    iteration, rank, name = (rng.integers(0, n, 500) for n in (7, 3, 5))
    index = facts_module.RowIndex(iteration, rank, name)
    for i, r, n in [(0, 0, 0), (6, 2, 4), (3, 1, 2)]:
        mask = (iteration == i) & (rank == r) & (name == n)
        assert index.rows(i, r, n).tolist() == np.flatnonzero(mask).tolist()
    assert len(index.rows(7, 0, 0)) == 0 and len(index.rows(-1, 0, 0)) == 0


def test_step_lookups_match_a_scan(straggler) -> None:
    facts = RunFacts(straggler)
    nodes, arrivals = facts.step_nodes, facts.arrivals
    assert arrivals is not None and len(arrivals)
    for iteration in np.unique(nodes.iteration).tolist():
        rows = nodes.rows_in(iteration)
        assert rows.tolist() == np.flatnonzero(nodes.iteration == iteration).tolist()
        r, n = int(nodes.rank[rows[-1]]), int(nodes.name[rows[-1]])
        where = np.flatnonzero(
            (nodes.iteration == iteration) & (nodes.rank == r) & (nodes.name == n)
        )
        assert nodes.largest(iteration, r, n) == int(where[np.argmax(nodes.self_ns[where])])
    i, r, n = int(arrivals.iteration[0]), int(arrivals.rank[0]), int(arrivals.name[0])
    mask = (arrivals.iteration == i) & (arrivals.rank == r) & (arrivals.name == n)
    assert arrivals.rows_of(i, r, n).tolist() == np.flatnonzero(mask).tolist()


def test_files_of_two_jobs_read_as_one_run_give_no_arrivals_days_late() -> None:
    """Rank 1 of one job and rank 0 of another, read as one run: their collectives pair up by
    occurrence, but spans a year apart are not one meeting, so no rank is late or last there."""
    files = [
        real_trace("hta/sampled_rank1_of128.json.gz"),
        real_trace("hta/queue_len_rank0_of16.json.gz"),
    ]
    tree = build_tree(read_run(files))
    arrivals = facts_module.arrivals_of(tree)
    assert arrivals is not None and len(arrivals)
    longest_step_ns = float(tree.steps.dur_ns.max())
    assert float(arrivals.late_ns.max()) <= longest_step_ns
