"""Benchmark the event-table cache: reading traces from their files against reading the tables a
first read kept (`teller.ingest.cache`).

    TELLER_TRACES=../shared/traces .venv/bin/python bench/cache.py [PATH…] [--repeats N]
    .venv/bin/python bench/cache.py --verdicts PATH…     # the verdicts, not the reading

For each path (a trace file or a run's directory; by default three real traces of
../shared/traces), `teller.ingest.read_run(PATH, jobs=1)` runs with the cache off (the anchor:
every file parsed), then once filling an empty cache, then from it, `--repeats` rounds
interleaved so load drift hits all three alike. CPU seconds (this process, `time.process_time`)
are the measure on a shared machine; wall seconds are printed beside them. Every read must give
the same table as the anchor's, or the script fails.

`--verdicts` checks what a user sees instead: `teller -q analyze PATH --format json` in a fresh
process with the cache off, filling and from it, and whether stdout, stderr and the exit status
are the same all three times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = (
    "tracelens/more/xdit_sd3.5_profile_rank0.json.gz",
    "hta/df_index_resolver_rank1_of2_216k_events.json.gz",
    "tracelens/sglang_Qwen3-8B_prefilldecode.json.gz",
)
MODES = ("no cache", "filling", "from cache")


def traces_root() -> Path:
    """Same lookup as tests/conftest.py: TELLER_TRACES, else ../shared/traces, else .traces."""
    configured = os.environ.get("TELLER_TRACES")
    if configured:
        return Path(configured)
    shared = REPO.parent / "shared" / "traces"
    return shared if shared.is_dir() else REPO / ".traces"


def timed_read(path: Path, cache: Path | None) -> tuple[float, float, object]:
    """(CPU s, wall s, event table) of one read of `path` with `cache` (None: off)."""
    from teller.ingest import read_run

    os.environ["TELLER_CACHE_DIR"] = str(cache) if cache is not None else "off"
    cpu, wall = time.process_time(), time.perf_counter()
    run = read_run([path], jobs=1)
    return time.process_time() - cpu, time.perf_counter() - wall, run


def measure(path: Path, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """Per mode, (CPU s, wall s) of each round; fails if a read's table differs."""
    times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for _ in range(repeats):
        cache = Path(tempfile.mkdtemp(prefix="teller-cache-bench-"))
        try:
            anchor = None
            for mode in MODES:
                cpu, wall, run = timed_read(path, None if mode == "no cache" else cache)
                times[mode].append((cpu, wall))
                if anchor is None:
                    anchor = run
                elif not run.table.equals(anchor.table) or run.sources != anchor.sources:
                    raise SystemExit(f"{path}: the {mode} read differs from the uncached one")
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return times


def same_verdicts(path: Path) -> tuple[int, bool]:
    """(exit status, whether the three analyses of `path` printed and exited alike)."""
    cache = Path(tempfile.mkdtemp(prefix="teller-cache-bench-"))
    command = [sys.executable, "-m", "teller", "-q", "analyze", str(path), "--format", "json"]
    try:
        seen = []
        for where in ("off", str(cache), str(cache)):
            env = {**os.environ, "TELLER_CACHE_DIR": where, "PYTHONPATH": str(REPO / "src")}
            done = subprocess.run(command, env=env, capture_output=True, timeout=900)
            seen.append((done.returncode, done.stdout, done.stderr))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return seen[0][0], seen[0] == seen[1] == seen[2]


def verdicts(paths: list[Path]) -> int:
    print("| input | exit status | off, filling, from cache alike |")
    print("|---|---:|---|")
    differ = 0
    for path in paths:
        status, alike = same_verdicts(path)
        differ += not alike
        print(f"| {path.name} | {status} | {'yes' if alike else 'NO'} |", flush=True)
    print(f"\n{len(paths) - differ} of {len(paths)} alike")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="trace files or run directories")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (medians are printed)")
    parser.add_argument(
        "--verdicts", action="store_true", help="compare teller analyze's output instead"
    )
    args = parser.parse_args()
    paths = args.paths or [traces_root() / relative for relative in DEFAULT_TRACES]
    missing = [p for p in paths if not p.exists()]
    if missing:
        print(f"error: {missing[0]} not found (set TELLER_TRACES or pass paths)", file=sys.stderr)
        return 2
    if args.verdicts:
        return verdicts(paths)
    sys.path.insert(0, str(REPO / "src"))
    load = os.getloadavg()[0]
    rows = []
    for path in paths:
        times = measure(path, args.repeats)
        rows.append((path, times))
        print(f"  {path.name} done", file=sys.stderr, flush=True)
    print(
        f"`bench/cache.py {' '.join(sys.argv[1:])}`: {os.cpu_count()} cores, {args.repeats}"
        f" rounds, medians; load {load:.2f} before, {os.getloadavg()[0]:.2f} after\n"
    )
    header = "| input | MB on disk |"
    for mode in MODES:
        header += f" {mode} CPU s | wall s |"
    print(header + " from cache / no cache (CPU) |")
    print("|---|---:|" + "---:|---:|" * len(MODES) + "---:|")
    from teller.ingest import find_trace_files

    for path, times in rows:
        size = sum(p.stat().st_size for p in find_trace_files([path])) / 1e6
        line = f"| {path.name} | {size:.1f} |"
        medians = {}
        for mode in MODES:
            medians[mode] = statistics.median(cpu for cpu, _ in times[mode])
            line += f" {medians[mode]:.2f} | {statistics.median(w for _, w in times[mode]):.2f} |"
        print(f"{line} {medians['from cache'] / medians['no cache']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
