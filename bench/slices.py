"""Benchmark the Kineto reader's sliced read against its whole-document read (issue 22, point 2).

    .venv/bin/python bench/slices.py TRACE [TRACE ...] [--repeats N]

A large trace is read a slice of events at a time as its text is inflated
(`teller.ingest.kineto._read_in_slices`); the anchor is the same reader with slicing off
(`SLICED_ABOVE_BYTES` raised past the file), which decodes the whole document at once. Each
read is a fresh interpreter with the event-table cache off, rounds interleaved (anchor then
sliced, then the other way round); printed are the medians of its CPU seconds
(`time.process_time()` around the read) and its peak RSS when the read is done (the child's
own VmHWM), the ratios sliced / whole, and
whether the two tables (`pa.Table.equals`) and their sources' facts are equal (the script
fails if not).
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
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
import pyarrow as pa
from teller.ingest import kineto
mode, trace, table_out = sys.argv[1:4]
if mode == "whole":
    kineto.SLICED_ABOVE_BYTES = 1 << 62
start = time.process_time()
events = kineto.read(trace)
cpu = time.process_time() - start
with open("/proc/self/status") as status:
    peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
with pa.OSFile(table_out, "wb") as sink, pa.ipc.new_file(sink, events.table.schema) as writer:
    writer.write_table(events.table)
sources = [s.to_json() for s in events.sources]
print(json.dumps({"cpu": cpu, "peak_kib": peak_kib, "rows": events.table.num_rows,
                  "sources": sources}))
"""


def measure(mode: str, trace: Path, table_out: Path) -> dict:
    """One read in a fresh interpreter: its CPU seconds, its peak RSS when the read is done
    (VmHWM, before the table is written out for the comparison), its rows and sources."""
    env = {**os.environ, "TELLER_CACHE_DIR": "off", "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(trace), str(table_out)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{mode} read of {trace} failed: {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout)
    result["peak_mb"] = result["peak_kib"] / 1024
    return result


def same_tables(first: Path, second: Path) -> bool:
    with pa.memory_map(str(first)) as a, pa.memory_map(str(second)) as b:
        return pa.ipc.open_file(a).read_all().equals(pa.ipc.open_file(b).read_all())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(
        f"`bench/slices.py`: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}\n"
    )
    print(
        "| trace | MB on disk | rows | whole CPU s | sliced CPU s | CPU ratio "
        "| whole peak MB | sliced peak MB | peak ratio | same table |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for trace in args.traces:
        runs: dict[str, list[dict]] = {"whole": [], "sliced": []}
        with tempfile.TemporaryDirectory() as scratch:
            tables = {mode: Path(scratch) / f"{mode}.arrow" for mode in runs}
            for round_number in range(args.repeats):
                order = list(runs) if round_number % 2 == 0 else list(runs)[::-1]
                for mode in order:
                    runs[mode].append(measure(mode, trace, tables[mode]))
            same = same_tables(tables["whole"], tables["sliced"]) and (
                runs["whole"][0]["sources"] == runs["sliced"][0]["sources"]
            )
        cpu = {mode: statistics.median(r["cpu"] for r in runs[mode]) for mode in runs}
        peak = {mode: statistics.median(r["peak_mb"] for r in runs[mode]) for mode in runs}
        print(
            f"| {trace.name} | {trace.stat().st_size / 1e6:.1f} | {runs['whole'][0]['rows']:,} "
            f"| {cpu['whole']:.2f} | {cpu['sliced']:.2f} | {cpu['sliced'] / cpu['whole']:.2f} "
            f"| {peak['whole']:.0f} | {peak['sliced']:.0f} | {peak['sliced'] / peak['whole']:.2f} "
            f"| {'yes' if same else 'NO'} |"
        )
        if not same:
            raise SystemExit(f"{trace}: the sliced read's table differs from the whole read's")


if __name__ == "__main__":
    main()
