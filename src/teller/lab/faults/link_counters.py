"""How often net_throttle's token bucket held a packet back, sampled while the fault is on.

A tbf bucket lets a burst through at line rate, so a step whose all-reduces fit in it is not
delayed at all: on a small model most decode steps are not, whatever the rate. The lab labels
the steps the fault acted on (`teller.lab.acted`), and for a rate limit the kernel counts that
itself: a qdisc's `overlimits` rises each time a packet had to wait for tokens. The counter read
is the bridge-side qdisc's, which shapes what the rank receives; it is read over netlink
(pyroute2: no `tc` process per sample) every `SAMPLE_INTERVAL_S` from the moment the fault is
applied until it is reverted, and written as one JSON line per sample, `{"t_ns": ...,
"overlimits": ...}` (cumulative), to the case's `run/link_overlimits.jsonl`.

Why that qdisc alone: the egress qdisc inside the rank's namespace also counts packets that
waited only briefly. Added in, it labelled steps whose all-reduce was 1.6x the unthrottled ones
(`tests/lab/test_lab_faults.py`'s rate-limit case asks for 3x); every recorded case so far was
labelled from the bridge side alone.
"""

from __future__ import annotations

import json
import signal
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


#: How long `start` waits for the first reading, and `stop` for the sampler to finish. A netlink
#: request can go unanswered (seen when a run is interrupted as the limit comes on), and the run's
#: clean-up must not wait on it.
ANSWER_LIMIT_S = 5.0
#: Process signals the sampler leaves to the main thread, where the run's handlers are.
MAIN_THREAD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class LinkOverlimits:
    """Samples the `overlimits` of the tbf qdisc on the guilty rank's bridge-side link, on a thread.

    The thread opens, uses and closes its own netlink socket (a pyroute2 socket used from another
    thread than its maker's opens a new connection there), and every wait on it is bounded: a
    sampler that stops answering becomes `error`, and the case is refused, instead of holding up
    the run."""

    def __init__(self, target: RankTarget, path: Path, interval_s: float = SAMPLE_INTERVAL_S):
        if target.host_link is None:
            raise TellerError("link counters need the rank in its own network namespace (root)")
        self.target = target
        self.path = path
        self.interval_s = interval_s
        self.samples: list[tuple[int, int]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sampling; returns once the first reading is taken (or failed, or timed out)."""
        self._thread = threading.Thread(
            target=self._run, args=(_netlink_socket_class(),), name="link-overlimits", daemon=True
        )
        self._thread.start()
        if not self._first.wait(ANSWER_LIMIT_S) and self.error is None:
            self.error = TellerError(
                f"the rate limit's counters on {self.target.host_link} gave no first reading "
                f"within {ANSWER_LIMIT_S:.0f} s (netlink did not answer)"
            )

    def stop(self) -> Path | None:
        """Stop sampling and write the file (None when nothing was sampled)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=ANSWER_LIMIT_S)
            if self._thread.is_alive() and self.error is None:
                self.error = TellerError(
                    f"the rate limit's counters on {self.target.host_link} stopped answering "
                    "(a netlink request got no reply); the samples end early"
                )
        samples = list(self.samples)
        if not samples:
            return None
        lines = "".join(json.dumps({"t_ns": t, "overlimits": n}) + "\n" for t, n in samples)
        return write_text_atomic(self.path, lines)

    def _run(self, make_socket) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, MAIN_THREAD_SIGNALS)
        host = None
        try:
            host = make_socket()
            index = host.link_lookup(ifname=self.target.host_link)[0]
            self._sample(host, index)  # the reading at the moment the limit came on
            self._first.set()
            while not self._stop.wait(self.interval_s):
                self._sample(host, index)
            self._sample(host, index)
        except Exception as error:  # reported by the injector after the run
            self.error = error
        finally:
            self._first.set()
            if host is not None:
                host.close()

    def _sample(self, sock, index: int) -> None:
        total = 0
        for message in sock.get_qdiscs(index=index):
            if message.get_attr("TCA_KIND") != "tbf":
                continue
            stats = message.get_attr("TCA_STATS2")
            queue = stats.get_attr("TCA_STATS_QUEUE") if stats is not None else None
            if queue is not None:
                total += int(queue["overlimits"])
        self.samples.append((time.time_ns(), total))


def _netlink_socket_class():
    """pyroute2's IPRoute, or a clear error where the lab's extra is not installed."""
    try:
        from pyroute2 import IPRoute
    except ImportError:
        raise TellerError(
            "net_throttle's labels need pyroute2 to read the rate limit's counters: "
            "pip install 'teller-rca[lab]'"
        ) from None
    return IPRoute


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
