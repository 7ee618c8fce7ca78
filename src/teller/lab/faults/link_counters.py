"""How often net_throttle's token buckets held a packet back, sampled while the fault is on.

A tbf bucket lets a burst through at line rate, so a step whose all-reduces fit in it is not
delayed at all: on a small model most decode steps are not, whatever the rate. The lab labels
the steps the fault acted on (`teller.lab.acted`), and for a rate limit the kernel counts that
itself: a qdisc's `overlimits` rises each time a packet had to wait for tokens. The counters of
the rank's two shaped qdiscs (egress inside its namespace, ingress on the bridge-side peer) are
read over netlink (pyroute2: no `tc` process per sample) every `SAMPLE_INTERVAL_S` from the
moment the fault is applied until it is reverted, and written as one JSON line per sample,
`{"t_ns": ..., "overlimits": ...}` (the two qdiscs summed, cumulative), to the case's
`run/link_overlimits.jsonl`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from teller.atomic import write_text_atomic
from teller.collect.host import SAMPLE_INTERVAL_S
from teller.errors import TellerError
from teller.lab.faults.os_fault import RankTarget

#: The file, under the case's `run/`, that holds the samples.
FILE_NAME = "link_overlimits.jsonl"
#: The counter's name, as `FaultKind.shows_in` names it.
COUNTER = "link_overlimits"


class LinkOverlimits:
    """Samples the summed `overlimits` of the guilty rank's tbf qdiscs on a thread."""

    def __init__(self, target: RankTarget, path: Path, interval_s: float = SAMPLE_INTERVAL_S):
        if target.namespace is None or target.rank_link is None or target.host_link is None:
            raise TellerError("link counters need the rank in its own network namespace (root)")
        self.target = target
        self.path = path
        self.interval_s = interval_s
        self.samples: list[tuple[int, int]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Open the two netlink sockets and start sampling; call once the qdiscs exist."""
        try:
            from pyroute2 import IPRoute
        except ImportError:
            raise TellerError(
                "net_throttle's labels need pyroute2 to read the rate limit's counters: "
                "pip install 'teller-rca[lab]'"
            ) from None
        host, inside = IPRoute(), _netlink_in(self.target.namespace, IPRoute)
        sockets = [
            (inside, inside.link_lookup(ifname=self.target.rank_link)[0]),
            (host, host.link_lookup(ifname=self.target.host_link)[0]),
        ]
        self._sample(sockets)  # the first reading is taken before start returns
        self._thread = threading.Thread(
            target=self._run, args=(sockets,), name="link-overlimits", daemon=True
        )
        self._thread.start()

    def stop(self) -> Path | None:
        """Stop sampling and write the file (None when nothing was sampled)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if not self.samples:
            return None
        lines = "".join(json.dumps({"t_ns": t, "overlimits": n}) + "\n" for t, n in self.samples)
        return write_text_atomic(self.path, lines)

    def _run(self, sockets: list) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self._sample(sockets)
            self._sample(sockets)
        except Exception as error:  # reported by the injector after the run
            self.error = error
        finally:
            for sock, _ in sockets:
                sock.close()

    def _sample(self, sockets: list) -> None:
        total = 0
        for sock, index in sockets:
            for message in sock.get_qdiscs(index=index):
                if message.get_attr("TCA_KIND") != "tbf":
                    continue
                stats = message.get_attr("TCA_STATS2")
                queue = stats.get_attr("TCA_STATS_QUEUE") if stats is not None else None
                if queue is not None:
                    total += int(queue["overlimits"])
        self.samples.append((time.time_ns(), total))


def _netlink_in(namespace: str, make_socket):
    """A netlink socket opened inside `namespace`. Why not pyroute2's NetNS: it forks a copy of
    this process, which inherits the collector's signal handlers, and the SIGTERM that ends
    that copy reaches the served command's process group through them. A socket stays in the
    namespace it was opened in, so this thread enters it (`setns` without a fork) for the
    socket's creation only."""
    from pyroute2.netns import setns

    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            setns(namespace, flags=0, fork=False)
        except OSError as error:
            raise TellerError(f"cannot enter network namespace {namespace}: {error}") from None
        try:
            return make_socket()
        finally:
            setns(own, fork=False)
    finally:
        os.close(own)


def read_link_overlimits(case_dir: Path) -> tuple[list[int], list[int]] | None:
    """The samples a net_throttle recording left (times, cumulative overlimits), or None."""
    path = case_dir / "run" / FILE_NAME
    if not path.exists():
        return None
    times, counts = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
            times.append(int(row["t_ns"]))
            counts.append(int(row["overlimits"]))
        except (ValueError, KeyError, TypeError):
            raise TellerError(f"{path}: line {number} is not a sample (t_ns, overlimits)") from None
    return times, counts
