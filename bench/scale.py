"""Benchmark how `teller analyze` grows with ranks and steps (issue 22), on simulated cases.

    .venv/bin/python bench/scale.py                          # 4x50 8x50 4x100 8x100, localizer
    .venv/bin/python bench/scale.py --method model           # the model method too
    .venv/bin/python bench/scale.py --large                  # adds 8x200 16x200 8x400
    .venv/bin/python bench/scale.py --cases 8x800 --keep /tmp/scale   # any RANKSxSTEPS, kept
    .venv/bin/python bench/scale.py --sources /tmp/anchor/src          # another checkout's code
    .venv/bin/python bench/scale.py --cache                  # and again from the event-table cache
    .venv/bin/python bench/scale.py --by-engine off          # hold the whole run (teller analyze's
                                                             # --no-by-engine); on: cut by engine
    .venv/bin/python bench/scale.py --cases 1x150000 --method model --jobs 2   # one 2 GB .json.gz,
                                                             # read in time windows
    .venv/bin/python bench/scale.py --window-events 500000   # pass --window-events to analyze

Each case is a `teller lab sim` run of TP4 replicas (ranks / 4 replicas of one 4-GPU node,
Python frames on, a straggler on rank 1 over the middle tenth of the steps, seed 0; fewer than 4
ranks are one engine of them all, and a single rank has its GPU throttled instead), written once
(reused from `--keep DIR` when already there). Each analysis is a fresh interpreter running
`teller -q analyze CASE --format json`; its CPU seconds (user + system, workers included) come
from `os.wait4`, its peak RSS from its own `/proc/self/status` VmHWM read just before it exits
(`ru_maxrss` would carry the forked parent's size over exec), and the peak of its RSS and its
workers' together from sampling /proc every 20 ms (*with workers*: a lower bound). The anchor is the simulator's own
wall time to write the same case (issue 22 asks for analysis within 3x of it). The growth
exponents are least-squares slopes of log CPU seconds against log ranks and log steps over all
cases together (1.0: linear). Printed as Markdown, for docs/benchmarks.md.

Analyses read every trace file (the event-table cache is off, `TELLER_CACHE_DIR=off`) unless
`--cache`, which then analyses each case twice more with a cache of its own, once filling it and
once reading from it, and prints those against the uncached run (the anchor), with whether the
three verdicts are byte-identical.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ("4x50", "8x50", "4x100", "8x100")
LARGE_CASES = ("8x200", "16x200", "8x400")
GPUS_PER_NODE = 4

#: Runs teller's CLI in this interpreter, then prints its own peak RSS (KiB) to the file named
#: first: VmHWM covers only this process's address space, whatever the parent's size was.
ANALYZE_ENTRY = """
import sys
from teller.cli import main
try:  # as the console script starts (teller.cli.run); an anchor's sources may not have it
    from teller.heap import give_freed_arrays_back
except ImportError:
    pass
else:
    give_freed_arrays_back()
peak_file, argv = sys.argv[1], sys.argv[2:]
try:
    status = main(argv)
finally:
    with open("/proc/self/status") as proc_status:
        peak_kib = next(int(line.split()[1]) for line in proc_status if line.startswith("VmHWM:"))
    with open(peak_file, "w") as handle:
        handle.write(str(peak_kib))
sys.exit(status)
"""


@dataclass(frozen=True)
class Shape:
    ranks: int
    steps: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        match = re.fullmatch(r"(\d+)x(\d+)", text)
        ranks = int(match[1]) if match else 0
        if match is None or not ranks or (ranks > GPUS_PER_NODE and ranks % GPUS_PER_NODE):
            raise SystemExit(
                f"case {text!r}: expected RANKSxSTEPS with RANKS at most 4, or a multiple of 4"
            )
        return cls(int(match[1]), int(match[2]))

    @property
    def name(self) -> str:
        return f"{self.ranks}x{self.steps}"


@dataclass(frozen=True)
class Built:
    directory: Path
    events: int
    input_bytes: int
    sim_wall_s: float


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float
    peak_rss_kib: int  # the analysing process's own
    tree_peak_rss_kib: int  # its and its workers' together, sampled (`TreeRss`)


#: How often the RSS of the analysing process and its workers is summed.
SAMPLE_S = 0.02


class TreeRss:
    """The largest sum of VmRSS over a process and its descendants (the `--jobs` workers),
    sampled every `SAMPLE_S` while it runs: what the machine must hold at once. A sample can
    miss a peak shorter than the interval, so it is a lower bound."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak_kib

    def _run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            self.peak_kib = max(self.peak_kib, sum(map(_rss_kib, _descendants(self.pid))))


def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue.extend(children.get(current, ()))
    return found


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next((int(line.split()[1]) for line in handle if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


#: The teller sources analyses run (`--sources`: another checkout's src, as an anchor).
SOURCES = [REPO / "src"]


def _env(cache: Path | None = None) -> dict[str, str]:
    """The analysing child's environment: these sources, and the event-table cache off unless
    a cache directory is given."""
    cache_dir = str(cache) if cache is not None else "off"
    return {**os.environ, "PYTHONPATH": str(SOURCES[0]), "TELLER_CACHE_DIR": cache_dir}


def _input_bytes(case: Path) -> int:
    return sum(p.stat().st_size for p in (case / "traces").glob("*.json.gz"))


def build(shape: Shape, root: Path) -> Built:
    """The simulated case for `shape` under root (written unless a complete one is there)."""
    case = root / f"sim-{shape.name}"
    timing = root / f"sim-{shape.name}.timing"
    if (case / "manifest.json").is_file() and timing.is_file():
        events, wall = timing.read_text().split()
        return Built(case, int(events), _input_bytes(case), float(wall))
    shutil.rmtree(case, ignore_errors=True)
    start = shape.steps // 2
    # fewer ranks than a node: one engine of them all (one rank: a throttled GPU, no peers)
    per_node = min(shape.ranks, GPUS_PER_NODE)
    fault = ["straggler", "--rank", "1"] if per_node > 1 else ["gpu_throttle", "--rank", "0"]
    command = [
        sys.executable,
        "-c",
        "import sys; from teller.cli import main; sys.exit(main(sys.argv[1:]))",
        "-q",
        "lab",
        "sim",
        "--nodes",
        str(max(shape.ranks // GPUS_PER_NODE, 1)),
        "--gpus-per-node",
        str(per_node),
        "--tp",
        str(per_node),
        "--steps",
        str(shape.steps),
        "--fault",
        *fault,
        "--window",
        f"{start}:{start + max(2, shape.steps // 10)}",
        "--seed",
        "0",
        "--jobs",
        "1",
        "--out",
        str(case),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"lab sim {shape.name} failed:\n{done.stderr[-2000:]}")
    found = re.search(r"([\d,]+) events", done.stdout)
    events = int(found[1].replace(",", "")) if found else 0
    timing.write_text(f"{events} {wall:.3f}")
    return Built(case, events, _input_bytes(case), wall)


def analyze(
    case: Path, method: str, extra: list[str], out: Path, cache: Path | None = None
) -> Measured:
    """One `teller analyze` in a fresh interpreter; the verdict goes to `out`."""
    peak_file = out.with_suffix(".peak")
    command = [sys.executable, "-c", ANALYZE_ENTRY, str(peak_file), "-q", "analyze", str(case)]
    command += ["--format", "json", "--method", method, *extra]
    started = time.perf_counter()
    with out.open("wb") as handle:
        process = subprocess.Popen(command, env=_env(cache), stdout=handle, stderr=subprocess.PIPE)
        sampled = TreeRss(process.pid)
        assert process.stderr is not None
        errors = process.stderr.read()
        tree_peak = sampled.stop()
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"analyze {case} --method {method} failed:\n{errors.decode()[-2000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return Measured(wall, cpu, int(peak_file.read_text()), tree_peak)


def growth_exponents(shapes: list[Shape], cpu_s: list[float]) -> tuple[float, float] | None:
    """Least-squares (ranks exponent, steps exponent) of cpu ~ ranks^a * steps^b; None when the
    cases do not vary both."""
    ranks = np.log([s.ranks for s in shapes])
    steps = np.log([s.steps for s in shapes])
    if len(set(ranks)) < 2 or len(set(steps)) < 2:
        return None
    design = np.column_stack([np.ones(len(shapes)), ranks, steps])
    coefficients, *_ = np.linalg.lstsq(design, np.log(cpu_s), rcond=None)
    return float(coefficients[1]), float(coefficients[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), help="RANKSxSTEPS")
    parser.add_argument("--large", action="store_true", help=f"add {' '.join(LARGE_CASES)}")
    parser.add_argument(
        "--method",
        choices=("localizer", "model"),
        action="append",
        help="methods to time (localizer always; --method model adds the model)",
    )
    parser.add_argument("--keep", type=Path, help="write (or reuse) the cases here")
    parser.add_argument("--jobs", type=int, help="pass --jobs N to teller analyze")
    parser.add_argument(
        "--cache", action="store_true", help="also analyse with the event-table cache, cold, warm"
    )
    parser.add_argument(
        "--sources", type=Path, help="teller sources to analyse with (default: this checkout)"
    )
    parser.add_argument(
        "--by-engine",
        choices=("auto", "on", "off"),
        default="auto",
        help="pass --by-engine (on) or --no-by-engine (off) to teller analyze; auto: neither",
    )
    parser.add_argument(
        "--window-events", type=int, help="pass --window-events N to teller analyze"
    )
    args = parser.parse_args()
    if args.sources is not None:
        SOURCES[0] = args.sources.resolve()
    shapes = [Shape.parse(text) for text in args.cases + (list(LARGE_CASES) if args.large else [])]
    methods = ["localizer"] + (["model"] if args.method and "model" in args.method else [])
    extra = ["--jobs", str(args.jobs)] if args.jobs else []
    extra += {"auto": [], "on": ["--by-engine"], "off": ["--no-by-engine"]}[args.by_engine]
    extra += ["--window-events", str(args.window_events)] if args.window_events else []
    temporary = None
    if args.keep is None:
        temporary = tempfile.TemporaryDirectory(prefix="teller-scale-")
        root = Path(temporary.name)
    else:
        root = args.keep
        root.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    rows = []
    cached: list[tuple[Shape, str, Measured, Measured, Measured, bool]] = []
    try:
        for shape in shapes:
            built = build(shape, root)
            measured = {
                m: analyze(built.directory, m, extra, root / f"{shape.name}.{m}.json")
                for m in methods
            }
            rows.append((shape, built, measured))
            if args.cache:
                cached += [_with_cache(shape, built, m, measured[m], extra, root) for m in methods]
            print(f"  {shape.name} done", file=sys.stderr, flush=True)
    finally:
        if temporary is not None:
            temporary.cleanup()
    print(
        f"`bench/scale.py {' '.join(sys.argv[1:])}`: {platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, load {load_before[0]:.2f} before,"
        f" {os.getloadavg()[0]:.2f} after\n"
    )
    header = "| ranks x steps | events | input MB | sim wall s |"
    rule = "|---|---:|---:|---:|"
    for method in methods:
        header += f" {method} CPU s | wall s | peak RSS MB | with workers MB | wall / sim |"
        rule += "---:|---:|---:|---:|---:|"
    print(header)
    print(rule)
    for shape, built, measured in rows:
        line = f"| {shape.name} | {built.events:,} | {built.input_bytes / 1e6:.1f} | {built.sim_wall_s:.1f} |"
        for method in methods:
            m = measured[method]
            ratio = m.wall_s / built.sim_wall_s
            line += (
                f" {m.cpu_s:.1f} | {m.wall_s:.1f} | {m.peak_rss_kib / 1024:.0f}"
                f" | {m.tree_peak_rss_kib / 1024:.0f} | {ratio:.1f} |"
            )
        print(line)
    print()
    for method in methods:
        exponents = growth_exponents([r[0] for r in rows], [r[2][method].cpu_s for r in rows])
        if exponents is None:
            print(f"{method}: growth exponents need cases varying both ranks and steps")
            continue
        rss = growth_exponents([r[0] for r in rows], [r[2][method].peak_rss_kib for r in rows])
        assert rss is not None
        print(
            f"{method}: CPU time grows as ranks^{exponents[0]:.2f} x steps^{exponents[1]:.2f},"
            f" peak RSS as ranks^{rss[0]:.2f} x steps^{rss[1]:.2f} (target <= 1.1)"
        )
    if cached:
        print()
        print(
            "| ranks x steps | method | no cache CPU s | filling CPU s | from cache CPU s"
            " | from cache / no cache | wall s | peak RSS MB | verdicts identical |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---|")
        for shape, method, off, cold, warm, same in cached:
            print(
                f"| {shape.name} | {method} | {off.cpu_s:.1f} | {cold.cpu_s:.1f} | {warm.cpu_s:.1f}"
                f" | {warm.cpu_s / off.cpu_s:.2f} | {warm.wall_s:.1f}"
                f" | {warm.peak_rss_kib / 1024:.0f} | {'yes' if same else 'NO'} |"
            )
    return 0


def _with_cache(
    shape: Shape, built: Built, method: str, off: Measured, extra: list[str], root: Path
) -> tuple[Shape, str, Measured, Measured, Measured, bool]:
    """The case analysed with an empty cache of its own (filling it), then from it."""
    cache = root / f"{shape.name}.{method}.cache"
    shutil.rmtree(cache, ignore_errors=True)
    verdicts = [root / f"{shape.name}.{method}.{when}.json" for when in ("cold", "warm")]
    cold = analyze(built.directory, method, extra, verdicts[0], cache)
    warm = analyze(built.directory, method, extra, verdicts[1], cache)
    shutil.rmtree(cache, ignore_errors=True)
    anchor = (root / f"{shape.name}.{method}.json").read_bytes()
    same = all(path.read_bytes() == anchor for path in verdicts)
    return shape, method, off, cold, warm, same


if __name__ == "__main__":
    raise SystemExit(main())
