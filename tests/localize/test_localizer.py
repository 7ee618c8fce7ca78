"""The localizer on small hand-built two-rank runs whose answer is known by construction.

Real recorded cases (lab and simulator) exercise it end to end in the evaluation tests; here each
mechanism is pinned on its own: step expectation by composition, compute excess, arrival.
"""

from __future__ import annotations

import json
from pathlib import Path

from teller.callchain.tree import build_tree
from teller.ingest import read_run
from teller.localize.localizer import NumericLocalizer

STEPS = 12


def write_run(
    directory: Path,
    slow_mm: dict[tuple[int, int], float] | None = None,
    late: dict[tuple[int, int], int] | None = None,
    tokens: dict[int, int] | None = None,
) -> list[Path]:
    """Two ranks, each step: 4 layers of (mm, add) then an all-reduce that ends when both arrive.

    `slow_mm[(rank, step)]` multiplies that rank's mm time; `late[(rank, step)]` delays its arrival
    at the all-reduce (µs); `tokens[step]` sets the prefill size (mm time grows with it).
    """
    slow_mm, late, tokens = slow_mm or {}, late or {}, tokens or {}
    events: dict[int, list[dict]] = {0: [], 1: []}
    clock = 1000.0
    for step in range(STEPS):
        ctx = tokens.get(step, 64)
        compute_end = {}
        for rank in (0, 1):
            t = clock
            body = []
            for _layer in range(4):
                mm = (20.0 + ctx * 0.5) * slow_mm.get((rank, step), 1.0)
                body.append(("aten::mm", t, mm))
                t += mm + 1
                body.append(("aten::add", t, 5.0))
                t += 6
            t += late.get((rank, step), 0)
            compute_end[rank] = (t, body)
        done = max(end for end, _ in compute_end.values()) + 30.0
        for rank in (0, 1):
            end, body = compute_end[rank]
            name = f"execute_context_1({ctx})_generation_0(0)"
            events[rank].append(op(name, "user_annotation", clock, done + 2 - clock))
            events[rank].extend(op(n, "cpu_op", ts, dur) for n, ts, dur in body)
            events[rank].append(op("gloo:all_reduce", "user_annotation", end, done - end))
        clock = done + 10
    paths = []
    for rank, rank_events in events.items():
        path = directory / f"rank{rank}.pt.trace.json"
        document = {
            "distributedInfo": {"rank": rank, "world_size": 2},
            "baseTimeNanoseconds": 1,
            "traceEvents": rank_events,
        }
        path.write_text(json.dumps(document))
        paths.append(path)
    return paths


def op(name: str, cat: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def localize(paths: list[Path], normal: list[Path] | None = None):
    localizer = NumericLocalizer()
    if normal:
        localizer.fit([build_tree(read_run(normal))])
    tree = build_tree(read_run(paths))
    return tree, localizer.score(tree)


def test_quiet_run_flags_nothing(tmp_path: Path) -> None:
    _, result = localize(write_run(tmp_path))
    assert len(result.steps) == STEPS
    assert result.anomalous_steps() == []


def test_slow_operator_on_one_rank_is_found(tmp_path: Path) -> None:
    _, result = localize(write_run(tmp_path, slow_mm={(1, 7): 4.0, (1, 8): 4.0}))
    assert [s.iteration for s in result.anomalous_steps()] == [7, 8]
    top = result.candidates[7][0]
    assert (top.rank, top.operator, top.kind) == (1, "aten::mm", "compute")
    # the peer's all-reduce wait is a symptom, never a candidate
    assert all(c.operator != "gloo:all_reduce" or c.rank == 1 for c in result.candidates[7])


def test_late_arrival_names_the_straggler_not_the_waiting_peer(tmp_path: Path) -> None:
    _, result = localize(write_run(tmp_path, late={(0, 5): 400}))
    assert [s.iteration for s in result.anomalous_steps()] == [5]
    top = result.candidates[5][0]
    assert (top.rank, top.operator, top.kind) == (0, "gloo:all_reduce", "arrival")


def test_longer_prefill_is_not_an_anomaly(tmp_path: Path) -> None:
    long_prompts = {s: 64 * (1 + s % 4) for s in range(STEPS)}  # 64..256 tokens, mm scales with it
    (tmp_path / "normal").mkdir()
    normal = write_run(tmp_path / "normal", tokens=long_prompts)
    shifted = {s: 512 for s in (9, 10, 11)}
    (tmp_path / "case").mkdir()
    case = write_run(tmp_path / "case", tokens={**long_prompts, **shifted})
    _, result = localize(case, normal=normal)
    assert result.anomalous_steps() == []
