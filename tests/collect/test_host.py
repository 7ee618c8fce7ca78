"""The host sampler on real processes: counters read from /proc and the cgroup files while a
child runs, the child stopped and continued, and the files read back by teller's reader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from teller.collect.host import HostSampler, name_host_files, read_sample, sources_of
from teller.ingest.host import read_host_file

BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end:\n    pass\n"


def test_a_stopped_process_is_seen_stopped_and_its_cpu_time_counted(tmp_path: Path) -> None:
    procs, host = tmp_path / "procs", tmp_path / "host"
    procs.mkdir()
    child = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        (procs / f"{child.pid}.json").write_text(json.dumps({"pid": child.pid}))
        sampler = HostSampler(procs, host, interval_s=0.01)
        sampler.start()
        time.sleep(0.6)  # busy: CPU time rises
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.4)
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.2)
        sampler.stop()
    finally:
        child.kill()
        child.wait()
    name_host_files(host, [{"pid": child.pid, "name": "rank3"}])
    series, warning = read_host_file(host / "rank3.jsonl", 3)
    assert warning is None and len(series) > 20
    assert 0.25e9 <= series.stopped_ns[-1] <= 0.6e9  # the 0.4 s stop, at 10 ms resolution
    cpu = series.counters["cpu_ns"]
    assert 0.3e9 <= cpu[-1] - cpu[0] <= 1.5e9  # about 0.8 s busy, counted in clock ticks


def test_a_process_that_exited_gives_no_sample() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    sources = sources_of(child.pid)
    child.wait()
    assert read_sample(sources) is None
