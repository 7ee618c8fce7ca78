"""Benchmark `teller analyze CASE --format json` of this checkout against an anchor commit.

    .venv/bin/python bench/analyze.py --case demo-out/case --anchor aac26f2 --rounds 3

The anchor's sources are checked out once into a temporary git worktree; each round runs the
anchor and this checkout as separate processes (the same venv, `PYTHONPATH` choosing the sources),
alternating which goes first. Reported: median wall and CPU seconds, peak RSS, the ratio of this
checkout to the anchor, and whether the two verdicts are identical (the `breakdown` key, which
later commits add beside the verdict, left out). Printed as Markdown, for
docs/benchmarks.md.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _verdict(path: Path) -> dict:
    document = json.loads(path.read_bytes())
    document.pop("breakdown", None)
    return document


def run_once(src: Path, case: Path, out: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS KiB) of one analyze in its own process, verdict written to out."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    entry = "import sys; from teller.cli import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", entry, "-q", "analyze", str(case), "--format", "json"]
    started = time.perf_counter()
    with out.open("wb") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{src}: analyze {case} failed")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, type=Path, help="case directory to analyse")
    parser.add_argument("--anchor", default="aac26f2", help="git commit to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        anchor_tree = Path(tmp) / "anchor"
        subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "worktree",
                "add",
                "-q",
                "--detach",
                str(anchor_tree),
                args.anchor,
            ],
            check=True,
        )
        try:
            sources = {"anchor": anchor_tree / "src", "this checkout": REPO / "src"}
            measured: dict[str, list[tuple[float, float, int]]] = {name: [] for name in sources}
            for round_ in range(args.rounds):
                order = list(sources) if round_ % 2 == 0 else list(sources)[::-1]
                for name in order:
                    out = Path(tmp) / f"{name}.json"
                    measured[name].append(run_once(sources[name], args.case, out))
            same = _verdict(Path(tmp) / "anchor.json") == _verdict(Path(tmp) / "this checkout.json")
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(anchor_tree)],
                check=False,
            )
    print(
        f"`teller analyze {args.case} --format json`, {args.rounds} rounds, medians; "
        f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}\n"
    )
    print("| sources | wall s | CPU s | peak RSS MB |")
    print("|---|---|---|---|")
    medians = {}
    for name, rows in measured.items():
        wall, cpu, rss = (statistics.median(column) for column in zip(*rows, strict=True))
        medians[name] = (wall, cpu)
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {rss / 1024:.0f} |")
    wall_ratio = medians["this checkout"][0] / medians["anchor"][0]
    cpu_ratio = medians["this checkout"][1] / medians["anchor"][1]
    print(
        f"\nthis checkout / anchor {args.anchor}: wall {wall_ratio:.2f}, CPU {cpu_ratio:.2f}; "
        f"verdicts {'identical' if same else 'DIFFER'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
