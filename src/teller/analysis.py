"""`Analysis`: the public Python API, one object per run, whose methods return tables.

Built from what a user has — a case directory, a folder of rank files, single traces — it runs the
pipeline stages lazily and hands back Arrow tables (call `.to_pandas()` on any of them) for
notebooks, and the verdict for everything else. The CLI's `analyze` is a thin layer over it.

    >>> from teller import Analysis
    >>> run = Analysis("case/")            # traces/, logs/, otlp/, host/ found under it
    >>> run.steps().to_pandas().head()     # one row per step and rank
    >>> verdict = run.diagnose()           # slow steps, guilty operator and rank, explanation
    >>> run.report("report.html")

The verdict comes from the root-cause model (`method="model"`, the default) with the numeric
localizer's measurements as its evidence; `method="localizer"` skips the model (no torch needed).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from teller.align.host import HostSteps, read_host_steps
from teller.callchain.breakdown import RunBreakdown, breakdown_of
from teller.callchain.engines import EnginePlace, StepNumbering
from teller.callchain.facts import Iterations, RunFacts
from teller.callchain.split import (
    EnginePart,
    EngineSplit,
    FileSteps,
    file_steps,
    split_by_engine,
)
from teller.callchain.tree import CallTree, build_tree
from teller.errors import TellerError
from teller.ingest import find_trace_files, map_files, note_refused, read_run
from teller.ingest.schema import EventTable, SourceInfo, ranks_of, traced_pids, warnings_of
from teller.layout import CaseDir
from teller.localize import SCORING_TABLES, Localization, NumericLocalizer
from teller.rca.diagnose import (
    METHODS,
    ModelUnavailable,
    RunInputs,
    diagnose,
    headline_finding,
    model_records,
    run_model,
    unavailable_note,
)
from teller.rca.merge import (
    EngineOutcome,
    SpilledRows,
    WindowBreakdowns,
    kept_rows,
    merged_breakdown,
    merged_verdict,
)
from teller.rca.verdict import Finding, Verdict
from teller.report.console import PLAIN, Look

if TYPE_CHECKING:
    from teller.align.align import AlignResult
    from teller.report.diff import RunDiff

PathLike = str | Path


class Analysis:
    """One run (all its rank files, logs and spans) and everything teller concludes about it."""

    def __init__(
        self,
        path: PathLike | Sequence[PathLike],
        logs: Sequence[PathLike] | None = None,
        otlp: Sequence[PathLike] | None = None,
        step_regex: str | None = None,
        progress: bool = False,
        method: str = "model",
        model_dir: PathLike | None = None,
        jobs: int = 1,
        engine: str = "local",
        ray_address: str | None = None,
        by_engine: bool = True,
        window_events: int | None = None,
    ) -> None:
        if method not in METHODS:
            raise TellerError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        self.paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        self.trace_files = find_trace_files(self.paths)
        if not self.trace_files:
            shown = ", ".join(map(str, self.paths))
            raise TellerError(f"{shown}: no trace files found (*.json, *.json.gz, *.sqlite)")
        self.log_files = (
            [Path(p) for p in logs] if logs is not None else self._found(CaseDir.log_files)
        )
        self.otlp_files = (
            [Path(p) for p in otlp] if otlp is not None else self._found(CaseDir.otlp_files)
        )
        if self.otlp_files and not self.log_files:
            shown = ", ".join(map(str, self.otlp_files))
            raise TellerError(
                f"{shown}: OTLP spans are placed on the trace through the engine's logs, and no "
                "log files were given (--logs) or found under DIR/logs/"
            )
        # host counters `teller collect` sampled beside the traces (DIR/host/rankN.jsonl)
        self.host_files = self._found(CaseDir.host_files)
        self.step_regex = step_regex
        self.progress = progress
        self.method = method
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.jobs = jobs  # worker processes reading the rank files (1: this process)
        self.engine = engine  # where the per-rank map runs: "local" or "ray"
        self.ray_address = ray_address  # a Ray cluster's; None: a private one on this machine
        # a run of several engines analysed one engine at a time (True) or whole (False)
        self.by_engine = by_engine
        self.place: EnginePlace | None = None  # set where this analysis is one engine of a run
        self.split_iterations: Iterations | None = None  # that run's iterations, then
        self.keep_span: Callable[[str], bool] | None = None  # and its spans, by request id
        #: trace file → its forest on disk, built by the run's first pass (`split`)
        self.kept_forests: dict[Path, Path] | None = None
        #: a run read in time windows of about this many events (`teller.callchain.windows`);
        #: None: only where a trace file is too large to hold
        self.window_events = window_events
        self.numbering: StepNumbering | None = None  # set where this analysis is one window
        self.window_files: list[FileSteps] | None = None  # that window's first pass, then
        self.log_window: tuple[int, int] | None = None  # and the time its logs are kept from

    def _found(self, files_of: Callable[[CaseDir], list[Path]]) -> list[Path]:
        """Logs, spans or host counters beside the traces, in the case layout (`teller.layout`)."""
        return [f for path in self.paths if path.is_dir() for f in files_of(CaseDir(path))]

    # -- the stages, computed once each ---------------------------------------------------------
    @cached_property
    def event_table(self) -> EventTable:
        """Every event of the run, raw arguments included: what `events()` and the Perfetto
        export give. The analysis itself never holds it (`tree`)."""
        return read_run(
            self.trace_files,
            progress=self.progress,
            jobs=self.jobs,
            engine=self.engine,
            ray_address=self.ray_address,
        )

    @cached_property
    def tree(self) -> CallTree:
        """The call-chain forest with every rank on one clock (offsets from collectives).

        Each rank file is read and built into its forest where it is read (`--jobs` processes,
        or Ray tasks: `teller.callchain.per_rank`) and only the forests are joined here: the
        tree and what the files said about themselves (`sources`) are all the analysis needs,
        and the tables beside the tree were most of a large run's memory. Where the table was
        asked for first, the tree is built from it."""
        from teller.align.align import on_one_clock, read_on_one_clock

        if "event_table" in self.__dict__:
            events = self.event_table
            self._sources, self._traced_pids = events.sources, traced_pids(events)
            tree, self.rank_offsets = on_one_clock(build_tree(events, step_regex=self.step_regex))
            return tree
        split = self.split  # a multi-engine run's first pass keeps the forests it built
        run, self.rank_offsets = read_on_one_clock(
            self.trace_files,
            step_regex=self.step_regex,
            progress=self.progress,
            jobs=self.jobs,
            engine=self.engine,
            ray_address=self.ray_address,
            place=self.place,
            kept=self.kept_forests,
            numbering=self.numbering,
        )
        if split is None:  # else each engine's analysis loads them again
            self._let_kept_forests_go()
        self._sources, self._traced_pids = run.sources, run.traced_pids
        return run.tree

    @property
    def sources(self) -> list[SourceInfo]:
        """What each trace file said about itself: rank, host, format, clock, warnings."""
        if not hasattr(self, "_sources"):
            self.tree  # noqa: B018 (reading the run sets them)
        return self._sources

    def share_read(self, done: Analysis) -> None:
        """Take `done`'s read of the same files: its tree (and event table, where it has one),
        what the files said about themselves and the ranks' clock offsets. Why: a second
        method's analysis of one run then skips reading and building it again, the costliest
        stages, while its own stages (localization, verdict) are computed afresh."""
        if done.trace_files != self.trace_files or done.step_regex != self.step_regex:
            raise ValueError("share_read: the other analysis read other files or steps")
        for stage in ("event_table", "tree"):
            if stage in vars(done):
                vars(self)[stage] = vars(done)[stage]
        for read in ("_sources", "_traced_pids", "rank_offsets"):
            if hasattr(done, read):
                setattr(self, read, getattr(done, read))

    @cached_property
    def host(self) -> HostSteps | None:
        """The host counters over each step (`teller.align.host`); None where none were sampled.
        What the files could not give (a cut-off last sample) is in `host_warnings`."""
        self.host_warnings: list[str] = []
        if not self.host_files:
            return None
        tree = self.tree  # first: building it sets `rank_offsets`
        host, self.host_warnings = read_host_steps(tree, self.host_files, self.rank_offsets)
        return host

    @cached_property
    def alignment(self) -> AlignResult | None:
        """Logs (and spans) placed on the tree's steps; None when the run has neither."""
        if not self.log_files and not self.otlp_files:
            return None
        from teller.align.align import align_tree

        tree = self.tree  # first: reading the run sets `_traced_pids` and `rank_offsets`
        return align_tree(
            tree,
            self.log_files,
            self.otlp_files,
            rank_offsets=self.rank_offsets,
            trace_pids=self._traced_pids,
            keep_span=self.keep_span,
            within=self.log_window,
        )

    # -- tables for notebooks -------------------------------------------------------------------
    def events(self) -> pa.Table:
        """One row per trace event (schema: teller.ingest.schema)."""
        return self.event_table.table

    def nodes(self) -> pa.Table:
        """One row per call-chain node: parent, depth, layer, name, rank, times, step."""
        return self.tree.to_arrow()

    def steps(self) -> pa.Table:
        """One row per (rank, step) with its batch composition."""
        return self.tree.steps.to_arrow()

    def collectives(self) -> pa.Table:
        """One row per (collective instance, rank): arrival and end on each rank."""
        return self.tree.comm.to_arrow()

    def logs(self) -> pa.Table:
        """One row per log record, with the step, rank and node it was aligned to (-1: none)."""
        if self.alignment is None:
            raise TellerError("no logs: pass logs=[...] or put them under DIR/logs/")
        return self.alignment.alignment.to_arrow(self.alignment.logs)

    def requests(self) -> pa.Table:
        """One row per (request, step) it was batched in, from logs or OpenTelemetry spans."""
        if self.alignment is None:
            raise TellerError("no logs or spans: request trees need one of them")
        return self.alignment.requests.to_arrow()

    def breakdown(self) -> RunBreakdown:
        """Where the time went on each rank, per step and over its whole run: GPU busy by kind
        (compute, communication, memory) as a union over streams, GPU idle split by what the
        host was doing (blocking sync and the operator behind it, launches, scheduler, Python),
        communication compute did not hide, and the top kernels and operators by GPU time.
        `.to_arrow()` gives one row per (rank, step), `.gaps.to_arrow()` every idle gap."""
        if self.windowed or self.split is not None:
            self.verdict  # noqa: B018 (analysing the parts merges their breakdowns)
            return self._breakdown
        return breakdown_of(self.facts)

    @cached_property
    def facts(self) -> RunFacts:
        """What the localizer and the model both compare (arrivals, work per step), once."""
        return RunFacts(self.tree, self.split_iterations)

    @cached_property
    def localization(self) -> Localization:
        """The numeric localizer's steps and candidates (the model's evidence, or the verdict)."""
        return NumericLocalizer().score(self.tree, self.facts)

    @property
    def inputs(self) -> RunInputs:
        return RunInputs(
            trace_files=self.trace_files,
            log_files=self.log_files,
            otlp_files=self.otlp_files,
            ranks=ranks_of(self.sources),
            warnings=warnings_of(self.sources),
        )

    # -- the verdict ---------------------------------------------------------------------------
    @cached_property
    def verdict(self) -> Verdict:
        if self.windowed:
            return self._verdict_by_window()
        if self.split is not None:
            return self._verdict_by_engine(self.split)
        # where the time went is measured first, while the facts hold little beyond the tree,
        # so that its per-node context is not built beside the localizer's tables
        self.breakdown()
        model, notes = None, []
        host = self.host
        notes += self.host_warnings
        if self.method == "model":
            engines = len(np.unique(self.tree.steps.engine))
            if engines > 1:
                notes.append(
                    f"the root-cause model read {engines} engines held whole, where its inputs "
                    "are one engine's: its verdict may flag steps that ran normally (analyse "
                    "without --no-by-engine, or use --method localizer)"
                )
            case_id = self.paths[0].name if len(self.paths) == 1 else ""
            try:
                records = model_records(self.tree, self.alignment, case_id, self.facts)
                # both scorings of the run are done before torch loads, and their per-node
                # tables let go, so the forward pass does not hold torch beside them
                self.localization  # noqa: B018
                self.facts.release(*SCORING_TABLES)
                model = run_model(records, self.tree, self.model_dir, host)
            except ModelUnavailable as error:
                notes.append(unavailable_note(error))
        return diagnose(
            self.tree,
            self.localization,
            self.alignment,
            self.inputs,
            model,
            notes,
            self.facts,
            host,
        )

    @cached_property
    def split(self) -> EngineSplit | None:
        """The run cut into its engines where it is analysed one engine at a time, else None.

        Why: an engine's steps are compared only with its own ranks', and the root-cause
        model's inputs are one engine's (`teller.rca.dataset`), so a run of several replicas is
        analysed replica by replica, and needs no more memory than its largest
        (`teller.callchain.split`). Finding the engines reads every file once; the forests built
        on the way are kept on disk (`kept_forests`) and loaded back, whether the run is then
        cut or held whole. What only the whole run can share out keeps it whole: steps found
        by repeats or periods, a file holding two engines' ranks, or a log file naming two
        engines; and so does `by_engine=False`."""
        if self.by_engine is False or self.place is not None or len(self.trace_files) < 2:
            return None
        if "tree" in self.__dict__ or "event_table" in self.__dict__ or self.windowed:
            return None
        if self.window_files is not None:  # a time window: its first pass found its steps
            files, refused = self.window_files, []
        else:
            self._kept_dir = tempfile.TemporaryDirectory(prefix="teller-forests-")
            read = partial(
                file_steps, step_regex=self.step_regex, keep_in=Path(self._kept_dir.name)
            )
            files, refused = map_files(
                read, self.trace_files, self.progress, self.jobs, self.engine, self.ray_address
            )
            self.kept_forests = {f.path: f.kept for f in files if f.kept is not None}
        split = None if refused else split_by_engine(files, self.numbering)
        if split is None:
            return None
        from teller.align.engine_logs import engine_logs

        self._engine_logs = engine_logs(self.log_files, len(split.parts))
        return split if self._engine_logs is not None else None

    def _let_kept_forests_go(self) -> None:
        """A run held whole needs its kept forests no more once its tree is built. (A run cut
        by engine keeps them while the analysis lives: a report draws its headline engine's
        tree again; the folder goes with the analysis, or at exit.)"""
        if hasattr(self, "_kept_dir"):
            self._kept_dir.cleanup()
            self.kept_forests = None

    def _engine_analysis(self, part: EnginePart) -> Analysis:
        """One engine's analysis: its files, its logs and its requests' spans
        (`teller.align.engine_logs`), every host counter file (each names its rank)."""
        logs = self._engine_logs.files_of(part.place.index)
        engine = Analysis(
            part.files,
            logs=logs,
            otlp=self.otlp_files if logs else [],
            step_regex=self.step_regex,
            method=self.method,
            model_dir=self.model_dir,
            jobs=self.jobs,
            engine=self.engine,
            ray_address=self.ray_address,
            by_engine=False,
        )
        engine.host_files = self.host_files
        engine.place = part.place
        engine.numbering = self.numbering
        engine.log_window = self.log_window
        engine.split_iterations = self.split.iterations
        engine.kept_forests = part.kept
        engine.keep_span = self._engine_logs.keeps_span(part.place.index) if logs else None
        return engine

    def _verdict_by_engine(self, split: EngineSplit) -> Verdict:
        """Each engine analysed on its own and let go; their verdicts made one."""
        outcomes, sources, rows = [], [], SpilledRows()
        parts: Iterator[EnginePart] = iter(split.parts)
        if self.progress:
            from tqdm import tqdm

            parts = tqdm(parts, total=len(split.parts), desc="engines", unit="engine", leave=False)
        for part in parts:
            engine = self._engine_analysis(part)
            verdict = engine.verdict
            findings = [self._run_numbered(f, part, engine.tree) for f in verdict.findings]
            outcomes.append(
                EngineOutcome(
                    verdict=replace(verdict, findings=findings),
                    breakdown=kept_rows(engine.breakdown(), {f.step for f in findings}, rows),
                    steps_scored=len(engine.localization.steps),
                    engine=part.place.index,
                )
            )
            sources.extend(engine.sources)
            del engine, verdict
        self._sources = sources
        self._breakdown = merged_breakdown([o.breakdown for o in outcomes], rows)
        return merged_verdict(outcomes, self.inputs, [split.note])

    @staticmethod
    def _run_numbered(finding: Finding, part: EnginePart, tree: CallTree) -> Finding:
        """`finding` with its nodes numbered as the whole run's tree numbers them."""
        node = finding.operator_node
        candidates = [
            {**c, "node": int(part.run_nodes(tree, [c["node"]])[0])}
            if c.get("node") is not None
            else c
            for c in finding.candidates
        ]
        return replace(
            finding,
            operator_node=None if node is None else int(part.run_nodes(tree, [node])[0]),
            candidates=candidates,
        )

    # -- a run read in time windows ------------------------------------------------------------
    @cached_property
    def windowed(self) -> bool:
        """Whether the run is read and analysed a time window at a time: asked for
        (`window_events`), or some trace file is too large to hold (`windows.too_large`).
        A window's own analysis is never cut again."""
        if self.place is not None or self.numbering is not None or self.window_files is not None:
            return False
        from teller.callchain.windows import can_window, too_large

        if self.window_events is None and not any(too_large(p) for p in self.trace_files):
            return False
        if self.window_events is not None and self.window_events < 1:
            raise TellerError(f"window_events must be 1 or more, not {self.window_events}")
        unreadable = [p for p in self.trace_files if not can_window(p)]
        if unreadable:
            shown = ", ".join(map(str, unreadable[:3]))
            if self.window_events is not None:
                raise TellerError(
                    f"{shown}: only Kineto/Chrome JSON traces can be read in time windows"
                )
            return False
        return True

    def _verdict_by_window(self) -> Verdict:
        """Each time window analysed as a run of its own and let go; the steps each owns
        reported, numbered as the whole run numbers them (`teller.callchain.windows`)."""
        from teller.callchain.windows import WINDOW_EVENTS, Ledger, read_windows

        events = self.window_events or WINDOW_EVENTS
        self._window_dir = tempfile.TemporaryDirectory(prefix="teller-windows-")
        read = read_windows(
            self.trace_files,
            Path(self._window_dir.name),
            events,
            self.step_regex,
            self.progress,
            self.jobs,
        )
        ledger = Ledger(read.passes)
        self._ledger = ledger
        outcomes, rows, parts = [], SpilledRows(), WindowBreakdowns()
        sources: dict[str, SourceInfo] = {}
        windows: Iterator[int] = iter(range(len(read.passes)))
        if self.progress:
            from tqdm import tqdm

            windows = tqdm(windows, total=len(read.passes), desc="windows", unit="window")
        for index in windows:
            if not read.passes[index].files:
                continue
            window = self._window_analysis(index)
            verdict = window.verdict
            findings = [f for f in verdict.findings if ledger.owns(index, f.step)]
            steps = [r for r in verdict.steps if ledger.owns(index, r.step)]
            breakdown = window.breakdown()
            mine = [b for b in breakdown.steps if ledger.owns(index, b.step)]
            rows.add(b.to_json() for b in mine)
            gaps = ledger.owned_gaps(index, breakdown.gaps)
            parts.add(mine, {f.step for f in findings}, gaps, breakdown.ranks_without_gpu)
            outcomes.append(
                EngineOutcome(
                    verdict=replace(verdict, findings=findings, steps=steps),
                    breakdown=RunBreakdown(runs=[], steps=[], gaps=gaps),
                    steps_scored=len({r.step for r in steps}),
                    engine=index,
                )
            )
            for source in window.sources:
                sources.setdefault(source.path, source)
            del window, verdict, breakdown, mine
        if not outcomes:
            raise TellerError(f"{self.trace_files[0]}: no events could be read in any window")
        self._sources = list(sources.values())
        note_refused(self._sources, read.refused)
        self._breakdown = parts.merged(rows)
        note = (
            f"read in {len(read.passes)} time windows of about {events:,} events each (a trace "
            "file too large to hold, or --window-events): each window's steps are compared "
            "with the steps near them, and a step is reported by the window it starts in"
        )
        return merged_verdict(outcomes, self.inputs, [note, *read.notes], part="window")

    def _window_analysis(self, index: int) -> Analysis:
        """Window `index` of a windowed run as a run of its own, from the forests its first pass
        kept (`teller.callchain.windows`)."""
        done = self._ledger.passes[index]
        window = Analysis(
            [f.path for f in done.files],
            logs=self.log_files,
            otlp=self.otlp_files,
            step_regex=self.step_regex,
            method=self.method,
            model_dir=self.model_dir,
            jobs=self.jobs,
            by_engine=self.by_engine,
        )
        window.host_files = self.host_files
        window.numbering = self._ledger.numbering(index)
        window.log_window = (done.window.read_start_ns, done.window.read_end_ns)
        window.window_files = done.files
        window.kept_forests = {f.path: f.kept for f in done.files if f.kept is not None}
        return window

    def diagnose(self) -> Verdict:
        """Slow steps, the guilty operator and rank for each, the explanation and the evidence.

        By the root-cause model unless built with `method="localizer"`; where the model cannot
        be loaded the localizer's verdict comes back instead, saying so in `warnings`."""
        return self.verdict

    def diff(self, other: Analysis, allow_mismatch: bool = False) -> RunDiff:
        """Run `other` compared against this one (the reference): step kinds and operators.

        `RunDiff.not_comparable` says why the two runs cannot be compared (no step kind or
        operator in common, or different ranks or world sizes unless `allow_mismatch`)."""
        from teller.report.diff import compare

        return compare(
            self.tree,
            other.tree,
            [str(p) for p in self.trace_files],
            [str(p) for p in other.trace_files],
            self.sources,
            other.sources,
            allow_mismatch=allow_mismatch,
        )

    def rendered(self, format: str, look: Look = PLAIN) -> Iterator[str]:
        """The verdict as text in `format` ("terminal", "json", "html"), in pieces to write as
        they come (`teller.report.render_pieces`). A run analysed one engine at a time draws
        its HTML from the engine of its headline finding, read again."""
        from teller.report import render_pieces

        verdict, breakdown = self.verdict, self.breakdown()
        if self.windowed:
            return self._rendered_by_window(format, look)
        if self.split is None:
            return render_pieces(verdict, self.tree, format, breakdown, self.facts, look)
        if format != "html":
            return render_pieces(verdict, None, format, breakdown, None, look)
        worst = headline_finding(verdict.findings)
        part = next(
            (p for p in self.split.parts if worst is not None and worst.rank in p.ranks),
            self.split.parts[0],
        )
        engine = self._engine_analysis(part)
        findings = [
            replace(f, operator_node=part.engine_node(f.operator_node))
            if f.operator_node is not None and f.rank in part.ranks
            else replace(f, operator_node=None)
            for f in verdict.findings
        ]
        shown = replace(verdict, findings=findings)
        # its own steps' rows in full: the report compares the headline step with a normal one
        drawn = replace(breakdown, steps=engine.breakdown().steps)
        return render_pieces(shown, engine.tree, format, drawn, engine.facts, look)

    def _rendered_by_window(self, format: str, look: Look) -> Iterator[str]:
        """A windowed run's verdict; its HTML drawn from the window that owns the headline
        finding, built again whole (its findings' nodes are numbered as its whole tree numbers
        them, whether it was analysed whole or by engine)."""
        from teller.report import render_pieces

        verdict, breakdown = self.verdict, self.breakdown()
        if format != "html":
            return render_pieces(verdict, None, format, breakdown, None, look)
        worst = headline_finding(verdict.findings)
        ledger = self._ledger
        index = next(
            (
                i
                for i, done in enumerate(ledger.passes)
                if done.files and worst is not None and ledger.owns(i, worst.step)
            ),
            next(i for i, done in enumerate(ledger.passes) if done.files),
        )
        window = self._window_analysis(index)
        window.by_engine = False
        findings = [
            f if ledger.owns(index, f.step) else replace(f, operator_node=None)
            for f in verdict.findings
        ]
        shown = replace(verdict, findings=findings)
        # its own steps' rows in full: the report compares the headline step with a normal one
        drawn = replace(breakdown, steps=window.breakdown().steps)
        return render_pieces(shown, window.tree, format, drawn, window.facts, look)

    def report(self, path: PathLike, format: str | None = None) -> Path:
        """Write the verdict as HTML (default for .html), JSON (.json) or text."""
        from teller.atomic import write_pieces_atomic
        from teller.report import format_for

        return write_pieces_atomic(Path(path), self.rendered(format_for(Path(path), format)))
