"""Compare `teller analyze` of one run held whole and analysed one engine at a time.

    .venv/bin/python bench/by_engine.py /tmp/scale/sim-16x800 --method localizer model

Each method runs `teller -q analyze CASE --format json` twice in fresh interpreters, with
`--no-by-engine` and with `--by-engine`, the event-table cache off; the two verdicts are then
compared: findings by (step, rank, operator, fault type), flagged steps, the (rank, step) rows
and their expected times and scores, the summary, and the JSON's `breakdown` byte for byte.
Printed as Markdown, for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ENTRY = "import sys; from teller.cli import main; sys.exit(main(sys.argv[1:]))"


def analyze(case: Path, method: str, choice: str, out: Path) -> str:
    """The JSON verdict's text of one analysis."""
    command = [sys.executable, "-c", ENTRY, "-q", "analyze", str(case), "--format", "json"]
    command += ["--method", method, choice, "-o", str(out)]
    env = {**os.environ, "TELLER_CACHE_DIR": "off"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"analyze {case} {choice} failed:\n{done.stderr[-2000:]}")
    return out.read_text()


def compare(whole_text: str, split_text: str) -> list[str]:
    """The comparison's table cells, whole against by engine."""
    whole, split = json.loads(whole_text), json.loads(split_text)

    def found(d: dict) -> set:
        return {(f["step"], f["rank"], f["operator"], f["fault_type"]) for f in d["findings"]}

    def flagged(d: dict) -> set:
        return {f["step"] for f in d["findings"]}

    def rows(d: dict) -> list:
        return [(r["rank"], r["step"], r["name"], r["start_ns"], r["dur_ns"]) for r in d["steps"]]

    pairs = list(zip(whole["steps"], split["steps"], strict=False))
    expected = sum(a["expected_ns"] == b["expected_ns"] for a, b in pairs)
    scores = sum(a["score"] == b["score"] for a, b in pairs)
    breakdown = (
        whole_text[whole_text.index('"breakdown"') :]
        == split_text[split_text.index('"breakdown"') :]
    )
    return [
        f"{len(found(whole))} / {len(found(split))} ({len(found(whole) & found(split))} alike)",
        f"{len(flagged(whole))} / {len(flagged(split))} ({len(flagged(whole) & flagged(split))} both)",
        "yes" if rows(whole) == rows(split) else "no",
        f"{expected} of {len(whole['steps'])}",
        f"{scores} of {len(whole['steps'])}",
        "yes" if whole["summary"] == split["summary"] else "no",
        "yes" if breakdown else "no",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", type=Path)
    parser.add_argument("--method", nargs="+", default=["localizer"])
    args = parser.parse_args()
    print(f"`bench/by_engine.py {' '.join(sys.argv[1:])}`\n")
    print(
        "| method | findings whole / by engine | flagged steps | step rows alike | expected "
        "times alike | scores alike | summary alike | breakdown alike |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="teller-by-engine-") as scratch:
        for method in args.method:
            texts = [
                analyze(args.case, method, choice, Path(scratch) / f"{method}{choice}.json")
                for choice in ("--no-by-engine", "--by-engine")
            ]
            print(f"| {method} | " + " | ".join(compare(*texts)) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
