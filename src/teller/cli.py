"""The `teller` command: one subcommand per public operation, each a thin layer over the library.

`main(argv)` returns an exit status so tests call it in-process. Results go to stdout; progress,
warnings and errors go to stderr. One place (`main`) maps errors to a one-line message and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from teller.errors import TellerError, printable

EXIT_OK, EXIT_ERROR = 0, 2
#: `teller diff`: B regressed beyond the gate; the runs cannot be compared.
EXIT_REGRESSION, EXIT_NOT_COMPARABLE = 1, 3


def cmd_info(args: argparse.Namespace) -> int:
    from teller.callchain.tree import build_tree
    from teller.ingest import read_run
    from teller.report.console import look_for
    from teller.report.info import render_info

    events = read_run(args.paths, progress=not args.quiet)
    tree = build_tree(events, step_regex=args.step_regex)
    print(render_info(events, tree, look_for(sys.stdout)))
    return EXIT_OK


def cmd_ingest(args: argparse.Namespace) -> int:
    import pyarrow.compute as pc

    from teller.ingest import find_trace_files, read_trace
    from teller.ingest.schema import EventTable, write_parquet

    files = find_trace_files(args.paths)
    if not files:
        raise TellerError(f"{', '.join(args.paths)}: no trace files found")
    tables = [(f, read_trace(f)) for f in files]  # read all first: bad input writes nothing
    out = Path(args.out)
    for path, events in tables:
        stem = path.name.split(".")[0]
        for source in events.sources:  # one export can hold several ranks (nsys)
            rank_rows = pc.equal(events.table.column("rank"), source.rank)
            one_rank = EventTable(table=events.table.filter(rank_rows), sources=[source])
            target = out / f"rank{source.rank}.{stem}.parquet"
            write_parquet(one_rank, target)
            print(f"{path} -> {target} ({len(one_rank):,} events)")
        for warning in events.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK


def cmd_tree(args: argparse.Namespace) -> int:
    from teller.callchain.render import render_step, render_tree
    from teller.callchain.tree import build_tree
    from teller.ingest import read_run

    events = read_run([args.path], progress=not args.quiet)
    tree = build_tree(events, step_regex=args.step_regex)
    rank = args.rank if args.rank is not None else (events.ranks[0] if events.ranks else 0)
    steps = tree.steps
    if args.step is not None:
        match = [
            k for k in range(len(steps)) if steps.rank[k] == rank and steps.index[k] == args.step
        ]
        if not match:
            available = int((steps.rank == rank).sum())
            raise TellerError(
                f"{args.path}: rank {rank} has no step {args.step} ({available} steps found)"
            )
        print(render_step(tree, match[0], max_depth=args.depth, show_python=args.python))
        return EXIT_OK
    roots = [r for r in tree.roots().tolist() if tree.rank[r] == rank and tree.stream[r] < 0]
    if not roots:
        raise TellerError(f"{args.path}: rank {rank} has no call-chain nodes")
    roots = sorted(roots, key=lambda r: -int(tree.dur[r]))[: args.roots]
    for root in roots:
        print(render_tree(tree, root, max_depth=args.depth, show_python=args.python))
    return EXIT_OK


def _step_range(text: str) -> tuple[int, int]:
    first, sep, last = text.partition(":")
    if not sep or not first.isdigit() or not last.isdigit() or int(last) < int(first):
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B with 0 <= A <= B")
    return int(first), int(last)


def cmd_collect(args: argparse.Namespace) -> int:
    from teller.collect import collect

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    env = {"TELLER_COLLECT_WITH_STACK": "1"} if args.with_stack else {}
    if args.step_regex:
        env["TELLER_COLLECT_STEP_REGEX"] = args.step_regex
    if args.no_shapes:
        env["TELLER_COLLECT_RECORD_SHAPES"] = "0"
    result = collect(command, Path(args.out), steps=args.steps, env=env, backend=args.backend)
    return result.exit_code  # status lines went to stderr; stdout carries only CMD's output


def cmd_lab_sim(args: argparse.Namespace) -> int:
    from teller.lab.sim.cli import render, run_from_args

    print(render(run_from_args(args, progress=not args.quiet)))
    return EXIT_OK


def cmd_lab_serve(args: argparse.Namespace) -> int:
    from teller.lab.run import parse_window
    from teller.lab.serve.launch import ServeFault, serve

    fault = None
    if args.fault != "none":
        fault = ServeFault(args.fault, args.rank, args.intensity, parse_window(args.window))
    profile_dir = args.profile_dir or os.environ.get("VLLM_TORCH_PROFILER_DIR") or None
    port = None if args.port < 0 else args.port
    return serve(
        args.out, args.tp, args.duration, args.rate, args.seed, port, args.host, profile_dir, fault
    )


def cmd_lab_run(args: argparse.Namespace) -> int:
    from teller.lab.run import CaseSpec, parse_window, run_case

    spec = CaseSpec(
        args.fault, args.rank, args.intensity, parse_window(args.window), args.tp, args.seed
    )
    spec.duration_s, spec.rate_per_s = args.duration, args.rate
    result = run_case(spec, args.out)
    labels = result.labels
    print(
        f"{result.case_dir}: {labels.fault} on rank {labels.guilty_rank}, "
        f"{len(labels.steps)} steps in the window, served in {result.serve_s:.1f} s"
    )
    return EXIT_OK


def cmd_lab_clean(args: argparse.Namespace) -> int:
    from teller.lab.netns import require_root
    from teller.lab.sweep import sweep

    require_root("`teller lab clean`")
    swept = sweep()
    for kind in ("namespaces", "links", "cgroups"):
        for name in getattr(swept, kind):
            print(f"removed {kind[:-1]} {name}")
    for failure in swept.failed:
        print(f"warning: could not remove {failure}", file=sys.stderr)
    print(f"{swept.removed} stale lab resources removed, {len(swept.killed)} processes killed")
    return EXIT_OK


def cmd_lab_dataset(args: argparse.Namespace) -> int:
    from teller.lab.dataset import build_dataset

    summary = build_dataset(args.n, args.out, seed=args.seed, progress=not args.quiet)
    print(
        f"{summary.recorded} recorded, {summary.skipped} already there, "
        f"{summary.failed} failed; index: {summary.index}"
    )
    return EXIT_OK if summary.failed == 0 else EXIT_ERROR


def cmd_analyze(args: argparse.Namespace) -> int:
    from teller.analysis import Analysis
    from teller.atomic import write_pieces_atomic
    from teller.ingest.parallel import default_jobs
    from teller.rca.diagnose import MODEL_UNAVAILABLE
    from teller.report import format_for
    from teller.report.console import PLAIN, look_for

    if args.jobs is not None and args.jobs < 1:
        raise TellerError(f"--jobs {args.jobs}: needs at least 1")
    if args.ray_address and args.engine != "ray":
        raise TellerError("--ray-address names a Ray cluster: it needs --engine ray")
    analysis = Analysis(
        args.paths,
        logs=args.logs,
        otlp=args.otlp,
        step_regex=args.step_regex,
        progress=not args.quiet,
        method=args.method,
        model_dir=args.model,
        jobs=args.jobs if args.jobs is not None else default_jobs(),
        engine=args.engine,
        ray_address=args.ray_address,
        by_engine=args.by_engine,
        window_events=args.window_events,
    )
    if args.perfetto and analysis.windowed:
        raise TellerError(
            "--perfetto writes every event of the run, and this run is read in time windows "
            "(a trace file's JSON is over 1 GiB, or --window-events): leave out --perfetto"
        )
    fmt = format_for(Path(args.out), args.format) if args.out else (args.format or "terminal")
    verdict = analysis.diagnose()
    screen = look_for(sys.stdout)
    # rendered as it is written: a long run's JSON is never held as one string
    pieces = analysis.rendered(fmt, PLAIN if args.out else screen)
    if args.perfetto:
        from teller.report.perfetto import write_perfetto

        written = write_perfetto(verdict, analysis.tree, Path(args.perfetto), analysis.event_table)
        print(f"annotated trace written to {written}")
    if args.out:
        path = write_pieces_atomic(Path(args.out), pieces)
        if fmt != "terminal":  # the verdict is the result; --quiet only drops progress bars
            print("".join(analysis.rendered("terminal", screen)), end="")
        print(f"report written to {path}")
    else:
        _write_lines(pieces)
    for warning in verdict.warnings:  # the model's fallback is in the verdict text itself
        if not warning.startswith(MODEL_UNAVAILABLE):
            print(f"warning: {printable(warning)}", file=sys.stderr)
    return EXIT_OK


def _write_lines(pieces: Iterable[str]) -> None:
    """Text to stdout as it comes, ending in a newline."""
    last = ""
    for piece in pieces:
        if piece:
            sys.stdout.write(piece)
            last = piece
    if not last.endswith("\n"):
        sys.stdout.write("\n")


def cmd_eval(args: argparse.Namespace) -> int:
    from teller.eval.cases import Split, find_cases, split_cases
    from teller.eval.harness import evaluate
    from teller.eval.methods import METHODS, checkpoint_method
    from teller.eval.scoreboard import render_markdown, write_scoreboard

    methods = dict(METHODS)
    if args.model:
        checkpoint = Path(args.model)
        if not (checkpoint / "config.json").is_file():
            raise TellerError(f"{checkpoint}: not a model checkpoint (no config.json)")
        methods["model"] = checkpoint_method(checkpoint)
    cases = find_cases([Path(p) for p in args.cases])
    if args.split:
        split = Split.read(Path(args.split))
    else:
        split = split_cases(
            cases, test_share=args.test_share, seed=args.seed, held_out_fault=args.held_out
        )
    names = list(methods) if args.all else [args.method]
    unknown = [n for n in names if n not in methods]
    if unknown:
        raise TellerError(f"unknown method {unknown[0]!r}; known: {', '.join(methods)}")
    result = evaluate({n: methods[n] for n in names}, cases, split, progress=not args.quiet)
    command = (
        "teller eval " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["eval"] else "teller eval"
    )
    note = f"{len(cases)} cases under {', '.join(args.cases)}"
    if args.all or args.out:
        for path in write_scoreboard(result, Path(args.out or "docs"), command, note):
            print(f"wrote {path}", file=sys.stderr)
    print(render_markdown(result, command, note))
    return EXIT_OK


def cmd_lab_recipe(args: argparse.Namespace) -> int:
    from teller.eval.recipes import build

    built, skipped, failed = build(Path(args.recipe), Path(args.out), progress=not args.quiet)
    print(
        f"{built} built, {skipped} already there, {failed} failed; index in {args.out}/index.jsonl"
    )
    return EXIT_OK if not failed else EXIT_ERROR


def cmd_tpe_train(args: argparse.Namespace) -> int:
    from teller.tpe.corpus import train_vocab

    result = train_vocab(args.paths, args.vocab, args.out, progress=not args.quiet)
    tpe = result.tpe
    print(
        f"{args.out}: {tpe.vocab_size:,} tokens ({len(tpe.base):,} kinds, {len(tpe.merges):,} "
        f"merges) from {result.runs} runs, {result.slices:,} slices, {result.nodes:,} nodes "
        f"→ {result.tokens:,} tokens (R {1 - result.tokens / result.nodes:.1%})"
    )
    return EXIT_OK


def cmd_tpe_stats(args: argparse.Namespace) -> int:
    from teller.tpe import TPE
    from teller.tpe.stats import render_stats, trace_stats

    tpe = TPE.load(args.vocab)
    print(render_stats(trace_stats(args.path, tpe, top=args.top), tpe))
    return EXIT_OK


def cmd_align(args: argparse.Namespace) -> int:
    from teller.align.align import align_run, render_by_step

    result = align_run([args.traces], args.logs, span_paths=args.otlp or (), year=args.year)
    steps = range(args.steps[0], args.steps[1] + 1) if args.steps else None
    print(render_by_step(result, steps=steps))
    counts = ", ".join(f"{n} {how}" for how, n in sorted(result.alignment.counts().items()))
    print(f"{len(result.logs):,} log records: {counts}", file=sys.stderr)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """Exit 0: no regression; 1: regression beyond the gate; 2: bad input; 3: not comparable."""
    import json

    from teller.analysis import Analysis
    from teller.report.console import look_for
    from teller.report.diff import render_diff_markdown, render_diff_terminal

    a, b = (Analysis(p, step_regex=args.step_regex, progress=not args.quiet) for p in args.runs)
    diff = a.diff(b, allow_mismatch=args.allow_mismatch)
    if args.format == "json":
        print(json.dumps(diff.to_json(), indent=2))
    elif args.format == "markdown":
        print(render_diff_markdown(diff, gate_pct=args.fail_on_regression), end="")
    elif args.format == "html":
        from teller.report.diff_html import render_diff_html

        print(render_diff_html(diff, gate_pct=args.fail_on_regression))
    else:
        print(render_diff_terminal(diff, look=look_for(sys.stdout)))
    if diff.not_comparable:
        for problem in diff.not_comparable:
            print(f"teller: not comparable: {problem}", file=sys.stderr)
        return EXIT_NOT_COMPARABLE
    if args.fail_on_regression is None:
        return EXIT_OK
    regressed = diff.regressions(args.fail_on_regression)
    for kind in regressed:
        print(
            f"teller: {kind.kind} steps regressed {kind.change_pct:+.1f}% ({kind.metric}), "
            f"beyond {args.fail_on_regression:g}%",
            file=sys.stderr,
        )
    return EXIT_REGRESSION if regressed else EXIT_OK


def _percent(text: str) -> float:
    """A non-negative percentage for `--fail-on-regression` (a negative gate fails every run)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def cmd_train(args: argparse.Namespace) -> int:
    from teller.rca.model import ModelConfig
    from teller.rca.train import TrainConfig, train

    weights = {  # unset flags keep ModelConfig's defaults, which live in one place
        f"lambda_{head}": getattr(args, f"lambda_{head}")
        for head in ("step", "op", "explain")
        if getattr(args, f"lambda_{head}") is not None
    }
    model = ModelConfig(use_logs=not args.no_logs, use_numeric=not args.no_numeric, **weights)
    config = TrainConfig(
        data=args.data,
        out=args.out,
        model=model,
        raw_nodes=args.raw_nodes,
        epochs=args.epochs,
        seed=args.seed,
        jobs=args.jobs,
        members=args.members,
        cache_dir=args.cache,
        held_out_fault=args.held_out,
        progress=not args.quiet,
    )
    result = train(config)
    print(
        f"{result.out}: {result.params:,} parameters, {result.cases} cases, {result.examples} steps "
        f"({result.anomalous} anomalous), loss {result.losses[0]:.4f} → {result.losses[-1]:.4f}, "
        f"{result.seconds:.0f} s"
    )
    return EXIT_OK


def cmd_calibrate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from teller.eval.calibrate import calibrate, write_calibration
    from teller.eval.cases import find_cases

    cases = find_cases([Path(p) for p in args.cases])
    calibration = calibrate(cases, args.model, progress=not args.quiet)
    table = Table(
        "threshold",
        "joint F1 H",
        "joint F1 V",
        "step recall H",
        "step recall V",
        "false alarms",
        title=f"{len(cases)} calibration cases",
    )

    def cell(values: dict[str, float], view: str) -> str:
        return f"{values[view]:.3f}" if view in values else "—"

    for score in calibration.scores:
        chosen = " ←" if score.threshold == calibration.step_threshold else ""
        table.add_row(
            f"{score.threshold:.2f}{chosen}",
            cell(score.joint_f1, "horizontal"),
            cell(score.joint_f1, "vertical"),
            cell(score.step_recall, "horizontal"),
            cell(score.step_recall, "vertical"),
            f"{score.false_alarm_rate:.2%}",
        )
    Console().print(table)
    if args.dry_run:
        print(f"step threshold {calibration.step_threshold:.2f} (not written: --dry-run)")
    else:
        path = write_calibration(args.model, calibration)
        print(f"{path}: step threshold {calibration.step_threshold:.2f}")
    return EXIT_OK


def cmd_diagnose(args: argparse.Namespace) -> int:
    from teller.analysis import Analysis
    from teller.report.terminal import render_findings

    analysis = Analysis(
        args.path,
        logs=args.logs,
        progress=not args.quiet,
        method=args.method,
        model_dir=args.model,
    )
    print(render_findings(analysis.diagnose(), top=args.top))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    if args.nice > 0:  # behind the engine for the CPU from the start, imports included
        os.nice(args.nice)
    from teller.watch import WatchConfig, parse_slo, watch

    profile_dir = args.profile_dir or os.environ.get("VLLM_TORCH_PROFILER_DIR")
    if not profile_dir:
        raise TellerError(
            "--profile-dir: where the engine writes its traces (vLLM: VLLM_TORCH_PROFILER_DIR); "
            "the watcher must see that folder"
        )
    config = WatchConfig(
        engine_url=args.engine,
        objectives=parse_slo(args.slo),
        out_dir=Path(args.out),
        profile_dir=Path(profile_dir),
        log_files=[Path(p) for p in args.logs or []],
        interval_s=args.interval,
        window_s=args.window,
        min_samples=args.min_samples,
        sustain_s=getattr(args, "for"),
        capture_s=args.capture,
        min_interval_s=args.min_interval,
        keep=args.keep,
        reference=not args.no_reference,
        reference_capture_s=args.reference_capture,
        reference_every_s=args.reference_every,
        otlp_url=args.otlp,
        metrics_port=args.metrics_port,
        metrics_host=args.listen,
        webhook_url=args.webhook,
        method=args.method,
        model_dir=Path(args.model) if args.model else None,
        max_incidents=args.max_incidents,
    )
    return watch(config)


_DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    """`500ms`, `30s`, `10m`, `1h` or plain seconds."""
    number, unit = text, "s"
    for suffix in sorted(_DURATION_UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            number, unit = text[: -len(suffix)], suffix
            break
    try:
        value = float(number) * _DURATION_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a duration like 30s, 10m, 1h"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration is not negative")
    return value


def _method_arguments(parser: argparse.ArgumentParser) -> None:
    """--method and --model, shared by `analyze` and `diagnose` (teller.rca.diagnose)."""
    parser.add_argument(
        "--method",
        choices=("model", "localizer"),
        default="model",
        help="who decides: the root-cause model, with the localizer's numbers as evidence "
        "(default), or the numeric localizer alone",
    )
    parser.add_argument("--model", help="model directory (default: the shipped model)")


def _quiet(parser: argparse.ArgumentParser) -> None:
    """`-q` after the subcommand as well as before it (SUPPRESS: an absent one keeps the
    top-level value)."""
    parser.add_argument(
        "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="teller", description="Find out why an LLM inference service is slow."
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, handler: Callable[[argparse.Namespace], int], help_text: str):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        _quiet(sub)
        return sub

    info = command("info", cmd_info, "summarise traces: ranks, steps, layers, span, warnings")
    info.add_argument("paths", nargs="+", help="trace files or directories of rank files")
    info.add_argument("--step-regex", help="regex naming step annotations (overrides built-ins)")

    ingest = command("ingest", cmd_ingest, "convert traces to Parquet event tables")
    ingest.add_argument("paths", nargs="+", help="trace files or directories of rank files")
    ingest.add_argument("-o", "--out", required=True, help="output directory")

    tree = command("tree", cmd_tree, "print the call-chain tree of a step (or of a rank)")
    tree.add_argument("path", help="trace file or directory of rank files")
    tree.add_argument("--rank", type=int, help="rank to show (default: the first)")
    tree.add_argument("--step", type=int, help="step index on that rank (default: whole rank)")
    tree.add_argument("--depth", type=int, default=4, help="levels to print (default 4)")
    tree.add_argument("--roots", type=int, default=3, help="without --step: longest N roots")
    tree.add_argument(
        "--python", action="store_true", help="show Python frames (hidden by default)"
    )
    tree.add_argument("--step-regex", help="regex naming step annotations (overrides built-ins)")

    collect = command("collect", cmd_collect, "run CMD with the profiler injected; exit as CMD")
    collect.add_argument("--out", default="teller-collect", help="output folder (new or empty)")
    collect.add_argument("--steps", type=_step_range, help="profile only steps A..B (0-based)")
    collect.add_argument(
        "--backend",
        choices=("torch", "nsys"),
        default="torch",
        help="torch: the PyTorch profiler (Kineto JSON); nsys: Nsight Systems (default torch)",
    )
    collect.add_argument("--with-stack", action="store_true", help="Python stacks (costly)")
    collect.add_argument("--step-regex", help="with --steps: regex naming step annotations")
    collect.add_argument("--no-shapes", action="store_true", help="cheaper; no batch shapes")
    collect.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    analyze = command(
        "analyze", cmd_analyze, "diagnose a run: slow steps, guilty operator and rank, why"
    )
    analyze.add_argument("paths", nargs="+", help="case directory, rank-file folder or trace files")
    analyze.add_argument("--logs", nargs="*", help="engine log files (default: DIR/logs/*.log)")
    analyze.add_argument(
        "--otlp", nargs="*", help="OTLP JSON span files (default: DIR/otlp/*.json)"
    )
    analyze.add_argument("--format", choices=("terminal", "json", "html"), help="default: terminal")
    analyze.add_argument("-o", "--out", help="write the report here (format from the suffix)")
    analyze.add_argument(
        "--perfetto",
        metavar="OUT",
        help="also write an annotated Chrome/Perfetto trace here (gzip-compressed when OUT "
        "ends in .gz, e.g. annotated.json.gz)",
    )
    analyze.add_argument("--step-regex", help="regex naming step annotations (overrides built-ins)")
    analyze.add_argument(
        "--jobs", type=int, help="processes reading the rank files (default: the core count)"
    )
    analyze.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="where the rank files are read: this machine's processes (default) or Ray tasks",
    )
    analyze.add_argument(
        "--ray-address",
        help="--engine ray: a running cluster (e.g. ray://head:10001 or auto; the workers must "
        "see the rank files at the paths given); default: a private Ray on this machine with "
        "--jobs CPUs, bound to 127.0.0.1",
    )
    analyze.add_argument(
        "--by-engine",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="analyse a run of several engines (replicas) one engine at a time, holding one "
        "engine's tree at once (the default); --no-by-engine holds the whole run",
    )
    analyze.add_argument(
        "--window-events",
        type=int,
        metavar="N",
        help="read the run in time windows of about N events each, holding one window at once "
        "(default: only where a trace file's JSON is over 1 GiB, in windows of 1,500,000)",
    )
    _method_arguments(analyze)

    evaluate = command("eval", cmd_eval, "score methods on labelled cases (DESIGN.md §5)")
    evaluate.add_argument("--cases", nargs="+", required=True, help="case directories or roots")
    chosen = evaluate.add_mutually_exclusive_group(required=True)
    chosen.add_argument(
        "--method",
        help="one method: localizer, threshold, zscore, gmm, logs, model, model-no-logs, "
        "model-no-numeric, model-raw-nodes, model-step-faults",
    )
    chosen.add_argument("--all", action="store_true", help="every method; writes the scoreboard")
    evaluate.add_argument("--split", help="JSON file with train/test case ids")
    evaluate.add_argument("--held-out", help="fault type kept wholly out of training")
    evaluate.add_argument("--test-share", type=float, default=0.5, help="test share per fault")
    evaluate.add_argument("--seed", type=int, default=0, help="split seed")
    evaluate.add_argument(
        "--model",
        metavar="DIR",
        help="score this checkpoint (teller train's output) as the method model",
    )
    evaluate.add_argument("-o", "--out", help="scoreboard directory (default with --all: docs)")

    align = command("align", cmd_align, "place engine log lines on the steps they describe")
    align.add_argument("traces", help="trace directory (rank files) or one trace file")
    align.add_argument("logs", nargs="+", help="engine log files or directories")
    align.add_argument("--otlp", nargs="*", help="OTLP JSON span files with request timings")
    align.add_argument("--year", type=int, help="year of log dates that print none")
    align.add_argument("--steps", type=_step_range, help="show only steps A..B")

    train = command("train", cmd_train, "train the root-cause model on labelled cases")
    train.add_argument("--data", nargs="+", required=True, help="case directories or roots")
    train.add_argument("-o", "--out", required=True, help="model directory to write")
    train.add_argument("--epochs", type=int, default=40, help="passes over the data (40)")
    train.add_argument("--seed", type=int, default=0, help="initialisation and shuffling seed")
    train.add_argument(
        "--jobs", type=int, default=1, help="processes reading cases, then training members"
    )
    train.add_argument(
        "--members",
        type=int,
        default=1,
        metavar="K",
        help="train an ensemble of K models (seeds SEED..SEED+K-1) that vote at diagnosis",
    )
    train.add_argument("--cache", help="directory caching the encoded cases between runs")
    train.add_argument("--no-logs", action="store_true", help="ablation: no log modality")
    train.add_argument("--no-numeric", action="store_true", help="ablation: no step numbers")
    train.add_argument("--raw-nodes", action="store_true", help="ablation: no TPE merges")
    train.add_argument(
        "--held-out",
        metavar="FAULT",
        help="leave this fault type's labelled steps out (a checkpoint that never saw it)",
    )
    for head in ("step", "op", "explain"):
        train.add_argument(
            f"--lambda-{head}",
            type=float,
            metavar="W",
            help=f"weight of L_{head} in L = λ_step·L_step + λ_op·L_op + λ_explain·L_explain "
            "(default: the model's, 1)",
        )

    calibrate = command(
        "calibrate",
        cmd_calibrate,
        "choose a trained model's step threshold on labelled cases it never trained on",
    )
    calibrate.add_argument("--cases", nargs="+", required=True, help="case directories or roots")
    calibrate.add_argument("--model", help="model directory (default: the shipped model)")
    calibrate.add_argument(
        "--dry-run", action="store_true", help="print the figures; leave config.json alone"
    )

    diagnose = command("diagnose", cmd_diagnose, "diagnose a run with the root-cause model")
    diagnose.add_argument("path", help="case directory or directory of rank trace files")
    diagnose.add_argument("--logs", nargs="*", help="engine log files (default: PATH/logs)")
    _method_arguments(diagnose)
    diagnose.add_argument("--top", type=int, default=10, help="steps to show")

    diff = command("diff", cmd_diff, "compare run B against run A: step kinds and operators")
    diff.add_argument("runs", nargs=2, metavar="RUN", help="A then B: case or trace directories")
    diff.add_argument(
        "--format",
        choices=("terminal", "json", "markdown", "html"),
        default="terminal",
        help="terminal text, JSON (schema teller.diff/2), markdown for a pull-request comment, "
        "or one self-contained HTML page with charts",
    )
    diff.add_argument(
        "--fail-on-regression",
        type=_percent,
        metavar="PCT",
        help="exit 1 when a step kind of B is more than PCT %% slower than in A (PCT >= 0); "
        "exit 3 when the runs cannot be compared, 2 on bad input",
    )
    diff.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare runs recorded on different ranks or world sizes (noted, not refused)",
    )
    diff.add_argument("--step-regex", help="regex naming step annotations (overrides built-ins)")

    watch = command(
        "watch", cmd_watch, "watch a live engine; capture and diagnose when an objective breaks"
    )
    watch.add_argument(
        "--engine", required=True, help="the engine's URL, e.g. http://127.0.0.1:8000"
    )
    watch.add_argument(
        "--slo",
        default="itl_p99<50ms,ttft_p99<2s",
        help="objectives, e.g. 'itl_p99<50ms,ttft_p99<2s,waiting<32' (default: that without waiting)",
    )
    watch.add_argument("--out", required=True, help="folder for the cases (the last --keep)")
    watch.add_argument(
        "--profile-dir", help="the engine's trace folder (default $VLLM_TORCH_PROFILER_DIR)"
    )
    watch.add_argument("--logs", nargs="*", help="the engine's log files, sliced per capture")
    watch.add_argument("--interval", type=_seconds, default=5.0, help="scrape period (5s)")
    watch.add_argument("--window", type=_seconds, default=60.0, help="quantile window (60s)")
    watch.add_argument(
        "--min-samples", type=int, default=20, help="observations before a window is judged"
    )
    watch.add_argument(
        "--for",
        type=_seconds,
        default=15.0,
        help="broken this long before a capture, as an alert's for: (15s)",
    )
    watch.add_argument("--capture", type=_seconds, default=5.0, help="profiler on for (5s)")
    watch.add_argument(
        "--min-interval", type=_seconds, default=600.0, help="at most one capture per (10m)"
    )
    watch.add_argument("--keep", type=int, default=20, help="cases kept on disk (20)")
    watch.add_argument(
        "--no-reference", action="store_true", help="take no normal capture to compare against"
    )
    watch.add_argument(
        "--reference-capture", type=_seconds, default=3.0, help="reference capture length (3s)"
    )
    watch.add_argument(
        "--reference-every", type=_seconds, default=3600.0, help="refresh the reference (1h)"
    )
    watch.add_argument("--otlp", help="OTLP/HTTP receiver, e.g. http://127.0.0.1:4318")
    watch.add_argument("--metrics-port", type=int, help="serve teller's own /metrics here")
    watch.add_argument("--listen", default="127.0.0.1", help="address for --metrics-port")
    watch.add_argument("--webhook", help="POST each incident's JSON here")
    watch.add_argument("--nice", type=int, default=10, help="run behind the engine (niceness)")
    watch.add_argument("--max-incidents", type=int, help="exit after this many reports")
    _method_arguments(watch)

    lab = commands.add_parser("lab", help="labelled data: the real fault lab and the GPU simulator")
    lab_commands = lab.add_subparsers(dest="lab_command", required=True)
    clean = lab_commands.add_parser(
        "clean", help="remove what killed lab runs left (namespaces, links, cgroups), by tag"
    )
    clean.set_defaults(handler=cmd_lab_clean)
    _quiet(clean)
    recipe = lab_commands.add_parser("recipe", help="build an evaluation set from a recipe file")
    recipe.set_defaults(handler=cmd_lab_recipe)
    _quiet(recipe)
    recipe.add_argument("recipe", help="recipe JSON (see evalsets/)")
    recipe.add_argument("--out", required=True, help="directory for the cases (resumable)")
    sim = lab_commands.add_parser(
        "sim", help="simulate a GPU-cluster case", description="simulate a GPU-cluster case"
    )
    sim.set_defaults(handler=cmd_lab_sim)
    _quiet(sim)
    from teller.lab.sim.cli import add_arguments as add_sim_arguments

    add_sim_arguments(sim)

    lab_serve = lab_commands.add_parser(
        "serve", help="serve the lab's Llama standalone (TP ranks, continuous batching)"
    )
    lab_serve.set_defaults(handler=cmd_lab_serve)
    _quiet(lab_serve)
    lab_serve.add_argument("--out", default="teller-lab-serve", help="run and ground-truth folder")
    lab_serve.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (default 2)")
    lab_serve.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals")
    lab_serve.add_argument("--rate", type=float, default=6.0, help="requests per second")
    lab_serve.add_argument("--seed", type=int, default=0, help="workload seed")
    lab_serve.add_argument(
        "--port", type=int, default=8000, help="/metrics and profiler endpoints (0: free, -1: off)"
    )
    lab_serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    lab_serve.add_argument(
        "--profile-dir", help="capture folder (default $VLLM_TORCH_PROFILER_DIR, else OUT/profiles)"
    )

    from teller.lab.faults.catalog import LAB_FAULTS

    lab_serve.add_argument(
        "--fault", choices=list(LAB_FAULTS), default="none", help="fault to inject (default none)"
    )
    lab_serve.add_argument("--rank", type=int, default=0, help="guilty rank")
    lab_serve.add_argument("--intensity", type=float, default=0.5, help="0..1, per fault")
    lab_serve.add_argument("--window", default="20:1000000", help="A:B seconds after serve start")

    lab_run = lab_commands.add_parser(
        "run", help="record one labelled case under a real fault (window in serve seconds)"
    )
    lab_run.set_defaults(handler=cmd_lab_run)
    _quiet(lab_run)
    lab_run.add_argument(
        "--fault", choices=list(LAB_FAULTS), default="none", help="fault to inject (default none)"
    )
    lab_run.add_argument("--rank", type=int, default=0, help="guilty rank")
    lab_run.add_argument("--intensity", type=float, default=0.5, help="0..1, per fault")
    lab_run.add_argument("--window", default="3:7", help="A:B seconds after serve start")
    lab_run.add_argument("--out", required=True, help="case folder (new)")
    lab_run.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (default 2)")
    lab_run.add_argument("--seed", type=int, default=0, help="workload seed")
    lab_run.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals")
    lab_run.add_argument("--rate", type=float, default=6.0, help="requests per second")

    lab_dataset = lab_commands.add_parser(
        "dataset", help="record many labelled cases (resumable; index.jsonl)"
    )
    lab_dataset.set_defaults(handler=cmd_lab_dataset)
    lab_dataset.add_argument("--n", type=int, required=True, help="number of cases")
    lab_dataset.add_argument("--out", required=True, help="dataset folder")
    lab_dataset.add_argument("--seed", type=int, default=0, help="plan seed")
    _quiet(lab_dataset)
    tpe = commands.add_parser("tpe", help="Trace Pair Encoding: train a vocabulary, measure it")
    tpe_commands = tpe.add_subparsers(dest="tpe_command", required=True)
    tpe_train = tpe_commands.add_parser("train", help="learn a TPE vocabulary from traces or cases")
    tpe_train.set_defaults(handler=cmd_tpe_train)
    tpe_train.add_argument("paths", nargs="+", help="trace files, case directories or their roots")
    tpe_train.add_argument("--vocab", type=int, required=True, help="vocabulary size (tokens)")
    tpe_train.add_argument("-o", "--out", required=True, help="vocabulary JSON to write")
    _quiet(tpe_train)
    tpe_stats = tpe_commands.add_parser("stats", help="reduction per step and the top merges")
    tpe_stats.set_defaults(handler=cmd_tpe_stats)
    _quiet(tpe_stats)
    tpe_stats.add_argument("path", help="trace file or case directory")
    tpe_stats.add_argument("--vocab", required=True, help="vocabulary JSON from `tpe train`")
    tpe_stats.add_argument("--top", type=int, default=8, help="merges to show (default 8)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except TellerError as error:
        print(f"teller: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("teller: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `teller tree … | head`: the reader left, which is not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


#: A bug in teller (an exception no error type covers): never 1, which `teller diff` gives a
#: regression, so a crash cannot read as a verdict in CI.
EXIT_INTERNAL = 70


def run() -> None:
    """Console-script entry point."""
    from teller.heap import give_freed_arrays_back

    give_freed_arrays_back()
    try:
        status = main()
    except Exception:
        import traceback

        traceback.print_exc()
        print(
            "teller: internal error (a bug: please report it with the trace above)", file=sys.stderr
        )
        status = EXIT_INTERNAL
    sys.exit(status)
