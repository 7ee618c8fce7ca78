"""Report: the verdict rendered for a terminal, as versioned JSON, as one HTML file, and as an
annotated Perfetto trace."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from teller.atomic import write_text_atomic
from teller.report.console import PLAIN, Look
from teller.report.terminal import render_terminal

if TYPE_CHECKING:
    from teller.callchain.breakdown import RunBreakdown
    from teller.callchain.facts import RunFacts
    from teller.callchain.tree import CallTree
    from teller.rca.verdict import Verdict

FORMATS = ("terminal", "json", "html")


def format_for(path: Path, requested: str | None) -> str:
    if requested:
        return requested
    return {".json": "json", ".html": "html", ".htm": "html"}.get(path.suffix.lower(), "terminal")


def render(
    verdict: Verdict,
    tree: CallTree,
    format: str,
    breakdown: RunBreakdown | None = None,
    facts: RunFacts | None = None,
    look: Look = PLAIN,
) -> str:
    """The verdict as text in `format`; the HTML report also draws the tree and the collectives
    (`facts`' arrivals) around it. JSON and terminal output carry where the time went
    (`breakdown`). Either is computed from `tree` when not given. Terminal text is laid out as
    `look` says (plain by default: a file or a pipe)."""
    return "".join(render_pieces(verdict, tree, format, breakdown, facts, look))


def render_pieces(
    verdict: Verdict,
    tree: CallTree | None,
    format: str,
    breakdown: RunBreakdown | None = None,
    facts: RunFacts | None = None,
    look: Look = PLAIN,
) -> Iterator[str]:
    """`render`'s text in pieces, for writing as they come.

    Why: the JSON of a long run carries a row per rank and step (about 39 MB at 8 ranks × 800
    steps); encoded as one string, it and the encoder's list of pieces would be held together
    at the end of the analysis. Piece by piece, only the verdict's dictionary is."""
    if breakdown is None:
        from teller.callchain.breakdown import run_breakdown

        if tree is None:
            raise ValueError("render_pieces: a breakdown or a tree is needed")
        breakdown = run_breakdown(tree)
    if format == "html":
        if tree is None:
            raise ValueError("render_pieces: the HTML report draws the tree")
        from teller.report.html import render_html

        yield render_html(verdict, tree, breakdown, facts)
    elif format == "json":
        if breakdown.rows is None:
            written = breakdown.to_json()
        else:  # rows kept on disk (a run analysed by engine) are read back as they are written
            written = {**replace(breakdown, rows=[]).to_json(), "steps": _Lazily(breakdown.rows)}
        document = {**verdict.to_json(), "breakdown": written}
        yield from json.JSONEncoder(indent=2).iterencode(document)
    else:
        yield render_terminal(verdict, breakdown, look)


class _Lazily(list):
    """Rows a JSON encoder with an indent (the standard library's Python one, which takes any
    `list` by its length and iteration) writes as it reads them, none of them held here."""

    def __init__(self, rows: Collection[dict]) -> None:
        super().__init__()
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict]:
        return iter(self._rows)


def write_atomic(path: Path, text: str) -> Path:
    """Write via a temp file and rename, so a failure never leaves half a report."""
    return write_text_atomic(path, text)
