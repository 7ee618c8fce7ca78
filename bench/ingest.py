"""Ingest benchmark: teller's Kineto reader against the JSON floor and Meta's HTA parser.

Issue 2, check 3. Three numbers anchor teller's ingest speed on one real 216k-event trace:

* the *floor*: gunzip + `orjson.loads` alone, what any Python reader must pay at least;
* *teller*: `teller.ingest.kineto.read` (and, separately, `teller.callchain.tree.build_tree`);
* *HTA*: HolisticTraceAnalysis (PyPI `traceinsight`) parsing the same file through its public
  path, `Trace(...).parse_single_rank(rank)` with its default parser backend, in its own venv
  (`.bench-venv`) so its pins never touch teller's environment.

Each measurement runs in a fresh subprocess, so imports and caches of one never help another and
peak RSS is that process's own (`os.wait4` rusage of the child). Rounds are interleaved (every
row once, then again) so load drift hits all alike; medians are reported. Events/s always uses one
numerator, `len(traceEvents)` of the file.

    .venv/bin/python bench/ingest.py --setup      # create .bench-venv with HTA (once)
    .venv/bin/python bench/ingest.py [--trace PATH] [--repeats N]

This file imports only the standard library at top level: the HTA child runs it under the bench
venv's interpreter, which has no teller.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_VENV = REPO / ".bench-venv"
BENCH_PYTHON = BENCH_VENV / "bin" / "python"
DEFAULT_TRACE = "hta/df_index_resolver_rank1_of2_216k_events.json.gz"
#: HTA is installed without its dependency list (which drags in jupyterlab); these are what
#: `hta.common.trace` actually imports, found by importing it in a bare venv.
HTA_PACKAGE = "traceinsight==0.6.1"
HTA_RUNTIME_DEPS = ("pandas", "numpy", "plotly", "networkx", "pydot", "psutil", "pyyaml")
#: Targets from issue 2: teller at least 4x HTA's events/s, at most 2x the floor's time.
TARGET_SPEEDUP_VS_HTA = 4.0
TARGET_RATIO_TO_FLOOR = 2.0
CHILD_TIMEOUT_S = 600


# -- children: each prints one JSON line {"seconds": ..., ...} --------------------------------------
class _Timed:
    """Wall and CPU seconds of the timed block, and the peak RSS when it began.

    CPU seconds are the cross-check on a shared 2-core machine: other people's load stretches wall
    time but not (much) the CPU time a single-threaded parse needs.
    """

    def __enter__(self) -> _Timed:
        self.start_rss_mib = _peak_rss_mib()
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = time.process_time() - self._cpu

    def result(self, **detail: object) -> dict:
        return {
            "seconds": self.wall_s,
            "cpu_seconds": self.cpu_s,
            "start_rss_mib": self.start_rss_mib,
            **detail,
        }


def child_floor(path: str) -> dict:
    """gunzip + orjson.loads: the least any reader that materialises the JSON must spend."""
    import gzip

    import orjson

    with _Timed() as timed:
        with open(path, "rb") as handle:
            raw = handle.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        document = orjson.loads(raw)
    events = document["traceEvents"] if isinstance(document, dict) else document
    return timed.result(trace_events=len(events))


def child_teller_read(path: str) -> dict:
    from teller.ingest.kineto import read

    with _Timed() as timed:
        events = read(path)
    return timed.result(rows=len(events))


def child_teller_read_pandas_loaded(path: str) -> dict:
    """kineto.read with pandas already imported, untimed: what the reader costs without the one-off.

    pyarrow 26's `pa.array` imports pandas on first use (to probe for pandas objects), and
    `build_table` is teller's first `pa.array` call, so a fresh process pays that import inside
    `read`. HTA imports pandas at module import, before its timed block. Not used for the targets.
    """
    import pandas  # noqa: F401

    return child_teller_read(path)


def child_teller_tree(path: str) -> dict:
    """build_tree alone: the read happens first, untimed (its memory still counts in peak RSS)."""
    from teller.callchain.tree import build_tree
    from teller.ingest.kineto import read

    events = read(path)
    with _Timed() as timed:
        tree = build_tree(events)
    return timed.result(rows=len(tree.parent))


def child_hta(path: str) -> dict:
    """HTA's public single-file path: a Trace over {rank: file}, then parse_single_rank."""
    import pandas
    from hta.common.trace import Trace
    from hta.common.trace_parser import get_default_trace_parsing_backend
    from hta.version import __version__ as hta_version

    rank = 0
    with _Timed() as timed:
        trace = Trace(trace_files={rank: path}, trace_dir=str(Path(path).parent))
        trace.parse_single_rank(rank)
    return timed.result(
        rows=len(trace.traces[rank]),
        backend=str(get_default_trace_parsing_backend()),
        versions=f"traceinsight {hta_version}, pandas {pandas.__version__}",
    )


def _peak_rss_mib() -> float:
    """This process's peak RSS so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


CHILDREN = {
    "floor": child_floor,
    "teller-read": child_teller_read,
    "teller-read-pandas-loaded": child_teller_read_pandas_loaded,
    "teller-tree": child_teller_tree,
    "hta": child_hta,
}


# -- the parent: run children, collect medians, print the table --------------------------------------
@dataclass
class Measurement:
    """Repeated runs of one child: wall seconds of the timed work and the process's peak RSS."""

    label: str
    seconds: list[float] = field(default_factory=list)
    peak_rss_mib: list[float] = field(default_factory=list)
    start_rss_mib: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    detail: dict = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def median_rss_mib(self) -> float:
        return statistics.median(self.peak_rss_mib)

    @property
    def median_start_rss_mib(self) -> float:
        return statistics.median(self.start_rss_mib)

    @property
    def median_cpu_s(self) -> float:
        return statistics.median(self.cpu_seconds)


def run_child(python: Path, kind: str, trace: Path) -> tuple[dict, float]:
    """Run one child; return its JSON result and its own peak RSS in MiB (from wait4's rusage)."""
    command = [str(python), str(Path(__file__).resolve()), "--child", kind, str(trace)]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    # Output goes to files, not pipes: Popen.communicate would reap the child before wait4 could
    # read its rusage, and a full pipe would stall it.
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env, cwd=REPO)
        killer = threading.Timer(CHILD_TIMEOUT_S, process.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            killer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    if process.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-8:]
        raise SystemExit(
            f"bench child {kind!r} failed (exit {process.returncode}):\n" + "\n".join(tail)
        )
    result = json.loads(out.decode().strip().splitlines()[-1])
    return result, usage.ru_maxrss / 1024.0  # Linux reports KiB


def measure(trace: Path, repeats: int) -> tuple[list[Measurement], int]:
    plan = [
        ("floor", "floor: gunzip + orjson.loads", Path(sys.executable)),
        ("teller-read", "teller kineto.read", Path(sys.executable)),
        ("teller-read-pandas-loaded", "teller read, pandas pre-imported", Path(sys.executable)),
        ("teller-tree", "teller build_tree", Path(sys.executable)),
        ("hta", "HTA parse_single_rank", BENCH_PYTHON),
    ]
    results = {kind: Measurement(label) for kind, label, _ in plan}
    trace.read_bytes()  # warm the page cache so the first round pays no disk read
    for round_index in range(repeats):
        for kind, _, python in plan:
            result, rss_mib = run_child(python, kind, trace)
            results[kind].seconds.append(result.pop("seconds"))
            results[kind].peak_rss_mib.append(rss_mib)
            results[kind].start_rss_mib.append(result.pop("start_rss_mib"))
            results[kind].cpu_seconds.append(result.pop("cpu_seconds"))
            results[kind].detail.update(result)
        print(f"  round {round_index + 1}/{repeats} done", file=sys.stderr)
    trace_events = results["floor"].detail["trace_events"]
    return [results[kind] for kind, _, _ in plan], trace_events


def render(trace: Path, repeats: int, rows: list[Measurement], trace_events: int) -> str:
    """The table: wall time decides; CPU time is printed beside it as the load-robust check."""
    floor, read, _read_pandas_loaded, tree, hta = rows  # the targets use the plain read
    lines = [
        f"trace   {trace.name} ({trace.stat().st_size / 1e6:.2f} MB gz, {trace_events:,} events)",
        f"machine {os.cpu_count()} CPUs ({_cpu_model()}), {platform.system()} {platform.machine()},"
        f" Python {platform.python_version()}",
        f"HTA     {hta.detail.get('versions')}, parser backend {hta.detail.get('backend')}",
        f"runs    {repeats} per row, each in a fresh process; medians, wall (min-max)",
        "",
        f"{'':32} {'wall s':>19} {'cpu s':>6} {'events/s':>9} {'peak RSS':>8} {'at start':>8}"
        f" {'rows out':>8}",
    ]
    for row in rows:
        wall = f"{row.median_s:.3f} ({min(row.seconds):.2f}-{max(row.seconds):.2f})"
        rate = f"{trace_events / row.median_s:,.0f}" if row is not tree else "-"
        out_rows = row.detail.get("rows", row.detail.get("trace_events", 0))
        lines.append(
            f"{row.label:32} {wall:>19} {row.median_cpu_s:>6.2f} {rate:>9}"
            f" {row.median_rss_mib:>4.0f} MiB {row.median_start_rss_mib:>4.0f} MiB {out_rows:>8,}"
        )
    read_and_tree_s = read.median_s + tree.median_s
    lines += [
        "",
        _target_line(
            "teller events/s / HTA events/s",
            hta.median_s / read.median_s,  # same numerator, so the inverse ratio of times
            hta.median_cpu_s / read.median_cpu_s,
            ">=",
            TARGET_SPEEDUP_VS_HTA,
        ),
        _target_line(
            "teller read time / floor time",
            read.median_s / floor.median_s,
            read.median_cpu_s / floor.median_cpu_s,
            "<=",
            TARGET_RATIO_TO_FLOOR,
        ),
        f"{'teller read + build_tree':33} {read_and_tree_s:.3f} s wall, "
        f"{hta.median_s / read_and_tree_s:.2f}x faster than HTA's parse alone",
    ]
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _target_line(what: str, wall_ratio: float, cpu_ratio: float, sense: str, target: float) -> str:
    met = wall_ratio >= target if sense == ">=" else wall_ratio <= target
    return (
        f"{what:33} {wall_ratio:5.2f}x wall ({cpu_ratio:.2f}x cpu)  target {sense} {target:g}x"
        f"  {'PASS' if met else 'MISS'}"
    )


def default_trace() -> Path:
    """Same lookup as tests/conftest.py: TELLER_TRACES, else ../shared/traces, else .traces."""
    configured = os.environ.get("TELLER_TRACES")
    if configured:
        root = Path(configured)
    else:
        shared = REPO.parent / "shared" / "traces"
        root = shared if shared.is_dir() else REPO / ".traces"
    return root / DEFAULT_TRACE


def setup_bench_venv() -> None:
    """Create .bench-venv with HTA if missing; HTA itself with --no-deps (see HTA_RUNTIME_DEPS)."""
    if BENCH_PYTHON.exists():
        print(f"bench venv already at {BENCH_VENV}", file=sys.stderr)
    else:
        print(f"creating {BENCH_VENV}", file=sys.stderr)
        venv.create(BENCH_VENV, with_pip=True)
    pip = [str(BENCH_PYTHON), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--no-deps", HTA_PACKAGE], check=True)
    subprocess.run([*pip, *HTA_RUNTIME_DEPS], check=True)
    subprocess.run([str(BENCH_PYTHON), "-c", "import hta.common.trace"], check=True)
    print("HTA importable in the bench venv", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, help=f"Kineto trace (default: {DEFAULT_TRACE})")
    parser.add_argument("--repeats", type=int, default=5, help="runs per row (at least 3)")
    parser.add_argument("--setup", action="store_true", help="create .bench-venv with HTA")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "TRACE"), help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        kind, path = args.child
        print(json.dumps(CHILDREN[kind](path)))
        return 0
    if args.setup:
        setup_bench_venv()
        return 0
    trace = args.trace or default_trace()
    if not trace.is_file():
        print(
            f"error: trace {trace} not found (set TELLER_TRACES or pass --trace)", file=sys.stderr
        )
        return 2
    if not BENCH_PYTHON.exists():
        print(f"error: no bench venv at {BENCH_VENV}: run `{sys.argv[0]} --setup`", file=sys.stderr)
        return 2
    if args.repeats < 3:
        print("error: --repeats must be at least 3 (medians of fewer are noise)", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    rows, trace_events = measure(trace, args.repeats)
    load_after = os.getloadavg()
    print(render(trace, args.repeats, rows, trace_events))
    print(
        f"load avg (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/"
        f"{load_before[2]:.2f}, after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
