"""A capture at most once per interval and only after a sustained breach, the last K cases on
disk, and never a half-written one."""

from __future__ import annotations

from pathlib import Path

from teller.watch import disk
from teller.watch.ratelimit import CaptureBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_capture_per_interval():
    clock = Clock()
    budget = CaptureBudget(600.0, clock)
    assert budget.allows()
    budget.spend()
    clock.now += 599.0
    assert not budget.allows() and budget.seconds_left() == 1.0
    clock.now += 1.0
    assert budget.allows()


def make_case(out: Path, name: str) -> Path:
    case = out / name
    (case / "traces").mkdir(parents=True)
    (case / disk.INCIDENT_FILE).write_text("{}")
    return case


def test_only_the_newest_cases_are_kept(tmp_path):
    names = [f"20260101T00000{k}000Z" for k in range(5)]
    for name in reversed(names):
        make_case(tmp_path, name)
    (tmp_path / ".reference").mkdir()  # not a case: never pruned
    (tmp_path / "notes").mkdir()  # a folder the user put there: not a case either
    removed = disk.prune_cases(tmp_path, keep=2)
    assert [p.name for p in removed] == names[:3]
    assert [p.name for p in disk.case_dirs(tmp_path)] == names[3:]
    assert (tmp_path / ".reference").is_dir() and (tmp_path / "notes").is_dir()


def test_a_partial_capture_is_never_a_case_and_is_removed_on_the_next_start(tmp_path):
    partial = disk.partial_dir(tmp_path, "20260101T000000000Z")
    (partial / "traces").mkdir(parents=True)
    (partial / "traces" / "rank0.pt.trace.json.gz").write_bytes(b"\x1f\x8b half")
    assert disk.case_dirs(tmp_path) == []
    assert disk.remove_partials(tmp_path) == [partial]
    assert not partial.exists()


def test_finishing_a_capture_is_one_rename(tmp_path):
    partial = disk.partial_dir(tmp_path, "x")
    partial.mkdir()
    (partial / disk.INCIDENT_FILE).write_text("{}")
    final = disk.finish(partial, tmp_path / "x")
    assert final.is_dir() and not partial.exists()
    assert disk.case_dirs(tmp_path) == [final]


def test_an_objective_must_stay_broken_for_a_while_before_it_counts():
    from teller.watch.persistence import StateDurations
    from teller.watch.slo import BROKEN, HELD, Check, parse_slo

    (objective,) = parse_slo("itl_p99<50ms")
    clock = Clock()
    durations = StateDurations(clock)
    held, broken = Check(objective, HELD, 0.02, 100), Check(objective, BROKEN, 0.2, 100)
    assert durations.update([held]) == [held]
    clock.now += 30.0
    assert durations.update([held]) == [] and durations.lasted_s(held) == 30.0
    assert durations.update([broken]) == [broken] and durations.lasted_s(broken) == 0.0
    clock.now += 14.0
    durations.update([broken])
    assert durations.lasted_s(broken) == 14.0
    durations.update([held])  # a burst that passed: the clock starts again
    clock.now += 1.0
    durations.update([broken])
    assert durations.lasted_s(broken) == 0.0
