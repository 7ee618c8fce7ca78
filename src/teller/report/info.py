"""`teller info`: what a run holds, before any diagnosis: its files, ranks, layers, steps and
collectives, and what the readers warned about. The steps per rank are a table."""

from __future__ import annotations

import numpy as np

from teller.callchain.render import format_ns
from teller.callchain.tree import CallTree
from teller.ingest.schema import EventTable
from teller.report.console import PLAIN, Look, table_lines, wrapped, wrapped_items


def render_info(events: EventTable, tree: CallTree, look: Look = PLAIN) -> str:
    """Summary of a run: files, ranks, layers, steps, collectives, span, warnings."""
    lines = []
    for source in events.sources:  # a path is one word: on its own line, never cut
        lines.extend(wrapped("file  ", str(source.path), look))
        host = f", host {source.host}" if source.host else ""
        detail = (
            f"format {source.format}, rank {source.rank} (from {source.rank_source}), "
            f"clock {source.clock}{host}"
        )
        lines.extend(wrapped("      ", detail, look))
    ts = events.table.column("ts_ns").to_numpy()
    dur = events.table.column("dur_ns").to_numpy()
    span = int((ts + dur).max() - ts.min()) if len(ts) else 0
    lines.append(f"ranks {events.ranks}  events {len(events):,}  span {format_ns(span)}")
    counts = events.layer_counts()
    lines.extend(wrapped_items("layers ", [f"{n} {c:,}" for n, c in counts.items()], look))
    depth = int(tree.depth.max()) if len(tree) else 0
    lines.append(f"tree  {len(tree):,} nodes, max depth {depth}")
    lines.extend(_steps(tree, look))
    if len(tree.comm):
        ranks = len(set(tree.comm.rank.tolist()))
        lines.append(f"comm  {tree.comm.num_instances} collective instances over {ranks} rank(s)")
    for warning in events.warnings + tree.warnings:
        lines.extend(wrapped("warning: ", warning, look))
    return "\n".join(lines)


def _steps(tree: CallTree, look: Look) -> list[str]:
    """One row per rank: how many steps, of which kinds, their median and longest, found how."""
    steps = tree.steps
    if not len(steps):
        return ["steps none found"]
    kind = np.asarray(steps.kind, dtype=object)
    found_by = np.asarray(steps.found_by, dtype=object)
    rows = []
    for rank in np.unique(steps.rank).tolist():
        mask = steps.rank == rank
        durations = steps.dur_ns[mask]
        rows.append(
            [
                str(rank),
                str(int(mask.sum())),
                ", ".join(sorted(set(kind[mask].tolist()))),
                format_ns(float(np.median(durations))),
                format_ns(float(durations.max())),
                ", ".join(sorted(set(found_by[mask].tolist()))),
            ]
        )
    header = ["rank", "steps", "kinds", "median", "longest", "found by"]
    return ["steps", *table_lines(header, rows, look, right=(0, 1, 3, 4))]
