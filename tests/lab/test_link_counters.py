"""The rate limit's counter sampler never holds up a run: a netlink request that gets no reply
becomes an error within a bounded time instead of a hang (a run interrupted as the limit came on
once waited forever on one). Fake sockets stand in for pyroute2's, so no root is needed."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from teller.lab.faults import link_counters
from teller.lab.faults.link_counters import LinkOverlimits
from teller.lab.faults.os_fault import RankTarget

TARGET = RankTarget(
    rank=1, pid=1, core=None, cgroup=None, namespace="ns1", rank_link="r1", host_link="h1"
)


class _Stats:
    def __init__(self, overlimits: int) -> None:
        self.overlimits = overlimits

    def get_attr(self, name: str):
        return {"overlimits": self.overlimits} if name == "TCA_STATS_QUEUE" else None


class _Qdisc:
    def __init__(self, overlimits: int) -> None:
        self.overlimits = overlimits

    def get_attr(self, name: str):
        return {"TCA_KIND": "tbf", "TCA_STATS2": _Stats(self.overlimits)}.get(name)


class _Socket:
    """Answers link look-ups; its qdisc dumps count up, or never return once `hang` is set."""

    def __init__(self, hang: threading.Event) -> None:
        self.hang = hang
        self.reads = 0
        self.closed = False

    def link_lookup(self, ifname: str) -> list[int]:
        return [7]

    def get_qdiscs(self, index: int) -> list[_Qdisc]:
        while self.hang.is_set():
            time.sleep(0.01)
        self.reads += 1
        return [_Qdisc(self.reads)]

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def sockets(monkeypatch: pytest.MonkeyPatch):
    hang = threading.Event()
    made: list[_Socket] = []

    def make() -> _Socket:
        made.append(_Socket(hang))
        return made[-1]

    monkeypatch.setattr(link_counters, "_netlink_socket_class", lambda: make)
    monkeypatch.setattr(link_counters, "ANSWER_LIMIT_S", 0.5)
    yield hang, made
    hang.clear()  # let a hung sampler thread finish


def test_samples_are_taken_until_stop_and_written(sockets, tmp_path: Path) -> None:
    _, made = sockets
    counters = LinkOverlimits(TARGET, tmp_path / "link.jsonl", interval_s=0.01)
    counters.start()
    time.sleep(0.1)
    written = counters.stop()
    rows = [json.loads(line) for line in written.read_text().splitlines()]
    assert counters.error is None and len(rows) >= 3
    assert [row["overlimits"] for row in rows] == sorted(row["overlimits"] for row in rows)
    assert rows[0]["overlimits"] == 1
    assert len(made) == 1 and made[0].closed


def test_a_sampler_that_stops_answering_is_an_error_not_a_hang(sockets, tmp_path: Path) -> None:
    hang, _ = sockets
    counters = LinkOverlimits(TARGET, tmp_path / "link.jsonl", interval_s=0.01)
    counters.start()
    hang.set()
    began = time.monotonic()
    counters.stop()
    assert time.monotonic() - began < 2.0
    assert "stopped answering" in str(counters.error)


def test_no_first_reading_is_an_error_within_the_limit(sockets, tmp_path: Path) -> None:
    hang, _ = sockets
    hang.set()
    counters = LinkOverlimits(TARGET, tmp_path / "link.jsonl", interval_s=0.01)
    began = time.monotonic()
    counters.start()
    assert time.monotonic() - began < 2.0
    assert "no first reading" in str(counters.error)
    assert counters.stop() is None
