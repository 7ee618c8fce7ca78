"""The planted-fault suite (issue 19): teller's methods against faults of known size in real traces.

    .venv/bin/python bench/planted.py                  # the whole suite, both methods (~10 min)
    .venv/bin/python bench/planted.py --quick          # 9 variants, under a minute
    .venv/bin/python bench/planted.py --report out/planted.json --markdown   # an earlier run

Every trace of `teller.eval.planting_suite.SUITE` under TELLER_TRACES (else ../shared/traces, else
.traces) is read once; each variant (one fault planted, `teller.eval.planting`) is written to a
temp folder, analysed in-process by each method through `teller.Analysis` exactly as
`teller analyze F --format json --method M` would, scored against its truth, and deleted. The
unmodified traces are analysed too: any step flagged on them is a false step.

Reported per method and fault family, by fault size as a share of the step (1-5%, 5-25%, >=25%):
step recall (the planted step is flagged), headline (the top finding is the planted step),
operator AC@1 over every variant (the top finding on the planted step names the slowed kernel or
the operator that launched it; a missed step is a miss), the same among found steps, whether it
names the planted instance, the right device on nsys stragglers, and how many other steps were
flagged. The issue's targets are checked at the end. All per-variant results go to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from teller.analysis import Analysis
from teller.errors import TellerError
from teller.eval.planting_suite import (
    BUCKETS,
    SIZES,
    SUITE,
    Planter,
    Score,
    TraceSpec,
    bucket_of,
    load,
    score,
)
from teller.report import render

REPO = Path(__file__).resolve().parents[1]
METHODS = ("localizer", "model")
#: --quick: one variant of each family, kind and size bucket, on small traces.
QUICK = (
    ("tracelens/hf_qwen1.5-0.5b_h100.json.gz", "kernel:gemm:0.1"),
    ("tracelens/hf_qwen1.5-0.5b_h100.json.gz", "kernel:attention:0.02"),
    ("tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz", "kernel:norm:0.5"),
    ("hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz", "kernel:gemm:0.25"),
    ("hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz", "host_gap:host_gap:0.05"),
    ("hta/queue_len_rank0_of16.json.gz", "kernel:gemm:0.5"),
    ("hta/queue_len_rank0_of16.json.gz", "kernel:nccl:0.5"),
    ("nsys_ai/fastvideo_h100_sp2_1s.sqlite", "straggler:device1:0.1"),
    ("nsys_ai/fastvideo_h100_sp2_1s.sqlite", "kernel:gemm:0.05"),
)
#: The issue's targets: (what, family, buckets, field, threshold).
TARGETS = (
    ("operator AC@1, faults >= 5% of a step", "kernel", ("5-25%", ">=25%"), "operator_hit", 0.9),
    ("operator AC@1, faults 1-5% of a step", "kernel", ("1-5%",), "operator_hit", 0.7),
    ("right device, nsys stragglers", "straggler", ("1-5%", "5-25%", ">=25%"), "device_hit", 0.9),
)


def traces_root() -> Path:
    """Same lookup as tests/conftest.py: TELLER_TRACES, else ../shared/traces, else .traces."""
    configured = os.environ.get("TELLER_TRACES")
    if configured:
        return Path(configured)
    shared = REPO.parent / "shared" / "traces"
    return shared if shared.is_dir() else REPO / ".traces"


class _TimedOut(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise _TimedOut in the main thread after `seconds` (one analysis must not stall the run)."""

    def expire(signum, frame):
        raise _TimedOut

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Outcome:
    """One method on one file: the verdict's JSON, or why there is none."""

    verdict: dict | None
    analysis: Analysis | None
    seconds: float
    error: str | None = None


def analyze(path: Path, methods: tuple[str, ...], limit_s: float) -> dict[str, Outcome]:
    """Each method's verdict on `path`, reading the file and building its tree once: the tree is
    the same whichever method decides, so the methods share it."""
    out: dict[str, Outcome] = {}
    shared: Analysis | None = None
    for method in methods:
        started = time.perf_counter()
        analysis = Analysis(path, method=method)
        if shared is not None:
            analysis.share_read(shared)
        try:
            with time_limit(limit_s):
                verdict = analysis.diagnose()
                document = json.loads(render(verdict, analysis.tree, "json"))
            out[method] = Outcome(document, analysis, time.perf_counter() - started)
            shared = shared or analysis
        except _TimedOut:
            out[method] = Outcome(
                None, None, time.perf_counter() - started, f"over {limit_s:.0f} s"
            )
        except TellerError as error:
            out[method] = Outcome(None, None, time.perf_counter() - started, f"refused: {error}")
        except Exception as error:  # a traceback is a result here: the suite records it
            message = f"crash: {type(error).__name__}: {error}"
            out[method] = Outcome(None, None, time.perf_counter() - started, message)
    return out


@dataclass
class Record:
    truth: dict
    scores: dict[str, dict] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def run_variant(planter: Planter, key: str, folder: Path, args: argparse.Namespace) -> Record | str:
    try:
        variant = planter.plant(key)
    except LookupError as error:
        return f"skipped {planter.spec.path} {key}: {error}"
    target = folder / variant.truth.variant.replace(":", "_").replace("/", "_")
    path = variant.write(target)
    record = Record(truth=variant.truth.to_json())
    for method, outcome in analyze(path, args.methods, args.limit_s).items():
        record.seconds[method] = round(outcome.seconds, 3)
        if outcome.verdict is None or outcome.analysis is None:
            missed = Score(False, False, None, None, None, 0, [], None, None, outcome.error)
            if variant.truth.accept_operators:
                missed.operator_hit = False
            if variant.truth.family == "kernel":
                missed.operator_instance = False
            if variant.truth.family == "straggler":
                missed.device_hit = False
            record.scores[method] = missed.to_json()
            continue
        found = score(
            variant.truth, outcome.verdict, outcome.analysis.tree, outcome.analysis.event_table
        )
        record.scores[method] = found.to_json()
    if args.keep:
        (target / "truth.json").write_text(json.dumps(record.truth, indent=2, default=str))
    else:
        path.unlink()
        target.rmdir()
    return record


def clean_run(path: Path, args: argparse.Namespace) -> dict:
    """The unmodified trace: every step a method flags on it is a false step."""
    result = {"trace": str(path.relative_to(traces_root())), "methods": {}}
    for method, outcome in analyze(path, args.methods, args.limit_s).items():
        if outcome.verdict is None:
            result["methods"][method] = {
                "error": outcome.error,
                "seconds": round(outcome.seconds, 3),
            }
            continue
        steps = outcome.verdict.get("steps") or []
        flagged = sorted(
            {r["step"] for r in steps if r.get("anomalous")}
            | {f["step"] for f in outcome.verdict.get("findings") or []}
        )
        result["methods"][method] = {
            "steps": len({(r["rank"], r["step"]) for r in steps}),
            "flagged": flagged,
            "summary": outcome.verdict.get("summary", ""),
            "seconds": round(outcome.seconds, 3),
        }
    return result


# -- aggregation ---------------------------------------------------------------------------------
RATES = (
    ("step recall", "step_found"),
    ("headline", "headline"),
    ("op AC@1", "operator_hit"),
    ("op AC@1 | found", None),
    ("op instance", "operator_instance"),
    ("device", "device_hit"),
)


def summarize(records: list[Record], clean: list[dict], methods: tuple[str, ...]) -> dict:
    rows = []
    for method in methods:
        for family in ("kernel", "host_gap", "straggler"):
            for label, _, _ in BUCKETS:
                chosen = [
                    {**r.scores[method], "_visible": made_later(r.truth)}
                    for r in records
                    if r.truth["family"] == family
                    and bucket_of(r.truth["fraction"]) == label
                    and method in r.scores
                ]
                if chosen:
                    rows.append(
                        {"method": method, "family": family, "bucket": label, **_rates(chosen)}
                    )
        controls = [
            r.scores[method]
            for r in records
            if r.truth["family"] == "control" and method in r.scores
        ]
        if controls:
            rows.append(
                {
                    "method": method,
                    "family": "control",
                    "bucket": "0",
                    "n": len(controls),
                    "other steps flagged": sum(s["other_steps_flagged"] for s in controls),
                }
            )
    shapes = _kernel_rates(records, methods, "shape", shape_of)
    kinds = _kernel_rates(records, methods, "kind", kind_and_band)
    false_steps = {}
    for method in methods:
        ran = [c["methods"][method] for c in clean if method in c["methods"]]
        false_steps[method] = {
            "traces": len(ran),
            "traces with a flagged step": sum(1 for m in ran if m.get("flagged")),
            "flagged steps": sum(len(m.get("flagged") or []) for m in ran),
            "steps": sum(m.get("steps", 0) for m in ran),
            "errors": sum(1 for m in ran if m.get("error")),
        }
    targets = []
    for method in methods:
        for what, family, buckets, key, threshold in TARGETS:
            chosen = [
                r.scores[method][key]
                for r in records
                if r.truth["family"] == family
                and bucket_of(r.truth["fraction"]) in buckets
                and method in r.scores
                and r.scores[method][key] is not None
            ]
            value = sum(chosen) / len(chosen) if chosen else None
            targets.append(
                {
                    "method": method,
                    "target": what,
                    "threshold": threshold,
                    "value": value,
                    "n": len(chosen),
                    "met": value is not None and value >= threshold,
                }
            )
        flagged = false_steps[method]["flagged steps"]
        targets.append(
            {
                "method": method,
                "target": "no step flagged on the unmodified traces",
                "threshold": 0,
                "value": flagged,
                "n": false_steps[method]["traces"],
                "met": flagged == 0 and false_steps[method]["errors"] == 0,
            }
        )
    return {
        "rows": rows,
        "shapes": shapes,
        "kinds": kinds,
        "false_steps": false_steps,
        "targets": targets,
    }


def _kernel_rates(records, methods, label: str, group_of) -> list[dict]:
    """The kernel family's rates per method and per group (`group_of(truth)`), groups in the
    order they first appear."""
    out = []
    for method in methods:
        groups = list(
            dict.fromkeys(group_of(r.truth) for r in records if r.truth["family"] == "kernel")
        )
        for group in groups:
            chosen = [
                {**r.scores[method], "_visible": made_later(r.truth)}
                for r in records
                if r.truth["family"] == "kernel"
                and group_of(r.truth) == group
                and method in r.scores
            ]
            if chosen:
                out.append({"method": method, label: group, **_rates(chosen)})
    return out


def kind_and_band(truth: dict) -> str:
    """The slowed kernel's kind and the size band the targets use (1-5%, >= 5% of a step)."""
    band = "1-5%" if bucket_of(truth["fraction"]) == "1-5%" else ">=5%"
    return f"{truth['kind']}, {band}"


SHAPES = ("several steps", "one step", "no step annotation")


def shape_of(truth: dict) -> str:
    steps = truth["steps_in_trace"]
    return SHAPES[0] if steps > 1 else SHAPES[1] if steps == 1 else SHAPES[2]


def made_later(truth: dict) -> bool:
    """Whether the fault made anything end later by at least half its size: the step, the
    device's GPU work, or (stragglers) the peer's collective. The rest was absorbed by slack in
    the capture (a host-bound GPU catching up, a wait on communication) and shows only in the
    slowed op itself."""
    moved = max(truth["step_growth_ns"], truth["gpu_growth_ns"], truth["peer_wait_added_ns"])
    return moved >= 0.5 * truth["added_ns"]


def _rates(scores: list[dict]) -> dict:
    out: dict[str, object] = {"n": len(scores)}
    for label, key in RATES:
        if key is None:
            found = [s for s in scores if s["step_found"] and s["operator_hit"] is not None]
            out[label] = _share([s["operator_hit"] for s in found])
            continue
        out[label] = _share([s[key] for s in scores if s[key] is not None])
    out["made later"] = _share([s["_visible"] for s in scores])
    out["other steps flagged"] = round(
        sum(s["other_steps_flagged"] for s in scores) / len(scores), 2
    )
    out["errors"] = sum(1 for s in scores if s.get("error"))
    return out


def _share(values: list[bool]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None


# -- output --------------------------------------------------------------------------------------
COLUMNS = (
    "n",
    "made later",
    "step recall",
    "headline",
    "op AC@1",
    "op AC@1 | found",
    "op instance",
    "device",
    "other steps flagged",
    "errors",
)


def _cell(value: object) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def print_tables(summary: dict, markdown: bool) -> None:
    header = ("method", "family", "size", *COLUMNS)
    body = [
        (row["method"], row["family"], row["bucket"], *(_cell(row.get(c)) for c in COLUMNS))
        for row in summary["rows"]
    ]
    clean_header = ("method", "traces", "with a flagged step", "flagged steps / steps", "errors")
    clean_body = [
        (
            m,
            str(v["traces"]),
            str(v["traces with a flagged step"]),
            f"{v['flagged steps']} / {v['steps']}",
            str(v["errors"]),
        )
        for m, v in summary["false_steps"].items()
    ]
    target_header = ("method", "target", "value", "n", "")
    target_body = [
        (
            t["method"],
            f"{t['target']} (>= {t['threshold']})" if t["threshold"] else t["target"],
            _cell(t["value"]),
            str(t["n"]),
            "PASS" if t["met"] else "MISS",
        )
        for t in summary["targets"]
    ]
    shape_columns = ("n", "made later", "step recall", "headline", "op AC@1", "op instance")
    shape_header = ("method", "trace", *shape_columns)
    shape_body = [
        (row["method"], row["shape"], *(_cell(row.get(c)) for c in shape_columns))
        for row in summary.get("shapes", [])
    ]
    kind_header = ("method", "kind, size", *shape_columns)
    kind_body = [
        (row["method"], row["kind"], *(_cell(row.get(c)) for c in shape_columns))
        for row in summary.get("kinds", [])
    ]
    tables = (
        ("planted faults", header, body),
        ("kernel faults by trace shape, all sizes", shape_header, shape_body),
        ("kernel faults by kind and size", kind_header, kind_body),
        ("unmodified traces (false steps)", clean_header, clean_body),
        ("issue 19 targets", target_header, target_body),
    )
    if markdown:
        for title, head, rows in tables:
            print(f"\n**{title}**\n")
            print("| " + " | ".join(cell.replace("|", "\\|") for cell in head) + " |")
            print("|" + "|".join("---" for _ in head) + "|")
            for row in rows:
                print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for title, head, rows in tables:
            print(f"\n{title}")
            for row in (head, *rows):
                print("  ".join(f"{cell:>12}" for cell in row))
        return
    console = Console(width=max(Console().width, 150))
    for title, head, rows in tables:
        table = Table(title=title)
        for column in head:
            table.add_column(
                column,
                justify="left" if column in ("method", "family", "target", "trace") else "right",
            )
        for row in rows:
            table.add_row(*row)
        console.print(table)


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def plan(args: argparse.Namespace) -> list[tuple[TraceSpec, list[str]]]:
    """(trace, variant keys) to run, in suite order."""
    sizes = tuple(args.sizes) if args.sizes else SIZES
    chosen = []
    for spec in SUITE:
        if args.trace and not any(part in spec.path for part in args.trace):
            continue
        if args.quick:
            keys = [key for path, key in QUICK if path == spec.path]
        else:
            keys = Planter.keys(spec, sizes)
        if keys:
            chosen.append((spec, keys))
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="9 variants on 5 traces")
    parser.add_argument("--seed", type=int, default=19, help="suite seed (default 19)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--trace", nargs="+", help="only traces whose path contains one of these")
    parser.add_argument("--sizes", nargs="+", type=float, help=f"fault sizes (default {SIZES})")
    parser.add_argument(
        "--json", type=Path, default=REPO / "out" / "planted.json", help="results file"
    )
    parser.add_argument("--keep", type=Path, help="keep the planted copies and their truth here")
    parser.add_argument("--limit-s", type=float, default=120.0, help="per analysis (default 120 s)")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    parser.add_argument("--report", type=Path, help="print the tables of an earlier --json, no run")
    args = parser.parse_args(argv)
    args.methods = tuple(args.methods)
    if args.report:
        document = json.loads(args.report.read_text())
        records = [Record(r["truth"], r["scores"], r["seconds"]) for r in document["records"]]
        methods = tuple(m for m in METHODS if any(m in r.scores for r in records))
        print_tables(summarize(records, document["clean"], methods), args.markdown)
        print(
            f"{document['command']}: {len(document['records'])} variants, {document['elapsed_s']} s, commit {document['commit']}"
        )
        return 0
    root = traces_root()
    if not root.is_dir():
        print(
            f"error: real traces not found at {root}: run `make traces` or set TELLER_TRACES",
            file=sys.stderr,
        )
        return 2
    work = plan(args)
    started = time.perf_counter()
    records: list[Record] = []
    clean: list[dict] = []
    skipped: list[str] = []
    total = sum(len(keys) + 1 for _, keys in work)
    with tempfile.TemporaryDirectory(prefix="teller-planted-") as scratch:
        folder = args.keep or Path(scratch)
        with tqdm(total=total, desc="planted", unit="variant", file=sys.stderr) as progress:
            for spec, keys in work:
                path = root / spec.path
                if not path.exists():
                    skipped.append(f"missing {spec.path}: run `make traces`")
                    progress.update(len(keys) + 1)
                    continue
                progress.set_postfix_str(Path(spec.path).name[:32])
                clean.append(clean_run(path, args))
                progress.update(1)
                planter = Planter(spec, load(path), args.seed)
                for key in keys:
                    outcome = run_variant(planter, key, folder, args)
                    if isinstance(outcome, str):
                        skipped.append(outcome)
                    else:
                        records.append(outcome)
                    progress.update(1)
    elapsed = time.perf_counter() - started
    summary = summarize(records, clean, args.methods)
    print_tables(summary, args.markdown)
    for line in skipped:
        print(line, file=sys.stderr)
    print(
        f"{len(records)} variants on {len(clean)} traces, {elapsed:.0f} s, seed {args.seed}, commit {_commit()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "command": " ".join(["bench/planted.py", *(argv if argv is not None else sys.argv[1:])]),
        "seed": args.seed,
        "commit": _commit(),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}",
        "elapsed_s": round(elapsed, 1),
        "summary": summary,
        "clean": clean,
        "records": [{"truth": r.truth, "scores": r.scores, "seconds": r.seconds} for r in records],
        "skipped": skipped,
    }
    args.json.write_text(json.dumps(document, indent=1, default=str))
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
