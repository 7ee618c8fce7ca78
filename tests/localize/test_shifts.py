"""Persistent operator shifts on hand-built two-rank runs (the lab's slow_operator case in
tests/test_analyze_e2e.py is the same mechanism on a real recording)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from builders import STEPS, write_run
from teller.callchain.tree import build_tree
from teller.ingest import read_run
from teller.localize.shifts import operator_shifts


def shifts(paths: list[Path]):
    tree = build_tree(read_run(paths))
    return tree, operator_shifts(tree)


def test_a_quiet_run_has_no_shift(tmp_path: Path) -> None:
    assert shifts(write_run(tmp_path))[1] == {}


def test_an_operator_slower_than_its_peer_for_several_steps_is_a_shift(tmp_path: Path) -> None:
    window = range(3, 8)  # 5 of 12 steps: the run median stays the usual ratio
    tree, found = shifts(write_run(tmp_path, slow_mm={(1, s): 1.8 for s in window}))
    assert sorted(found) == list(window)
    for iteration in window:
        top = found[iteration][0]
        assert (top.rank, tree.names[top.name]) == (1, "aten::mm")
        assert top.excess_ns > 100_000 and top.steps == len(window)
        assert tree.names[int(tree.name[top.node])] == "aten::mm"


def test_a_one_step_spike_is_not_a_shift(tmp_path: Path) -> None:
    assert shifts(write_run(tmp_path, slow_mm={(1, 5): 4.0}))[1] == {}


def test_a_shift_shorter_than_the_window_is_not_persistent(tmp_path: Path) -> None:
    assert shifts(write_run(tmp_path, slow_mm={(1, s): 1.8 for s in (4, 5)}))[1] == {}
    assert STEPS >= 10  # the series needs two windows of steps


def test_a_step_only_one_rank_ran_is_compared_quietly(tmp_path: Path) -> None:
    """Rank 1's capture stops a step early: rank 0's last step has no peer to compare with,
    which is no anomaly and must not print NumPy's all-NaN warning at the user."""
    paths = write_run(tmp_path)
    document = json.loads(paths[1].read_text())
    last_start = max(
        e["ts"]
        for e in document["traceEvents"]
        if e["cat"] == "user_annotation" and e["name"].startswith("execute_")
    )
    document["traceEvents"] = [e for e in document["traceEvents"] if e["ts"] < last_start]
    paths[1].write_text(json.dumps(document))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shifts(paths)[1] == {}
