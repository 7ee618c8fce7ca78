"""Text for a terminal: tables laid out by rich, prose wrapped at spaces, plain unless a terminal.

rich sizes each column to its contents and wraps a cell inside its own column, so a long operator
name stays in its column instead of pushing the row off the screen. Text that goes to a pipe, a
file or a test is plain at a fixed width (no colour, no control codes), so it reads and compares
the same everywhere; a terminal gets its own width and bold headers. Prose is wrapped at spaces
only: a kernel name or a log word is never cut in two.

Every line of a terminal report goes through `table_lines` or `wrapped`, which show the control
characters of names and log lines as escapes, so colour is the only code that reaches a terminal.
"""

from __future__ import annotations

import io
import os
import shutil
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from teller.errors import printable

#: Width of plain output (pipes, files, tests), and the widest a terminal's output is laid out.
PLAIN_WIDTH = 100
MAX_WIDTH = 160
#: Space between table columns.
COLUMN_GAP = 2


@dataclass(frozen=True)
class Look:
    """How text is laid out: its width in characters, and whether it may carry colour."""

    width: int = PLAIN_WIDTH
    color: bool = False


#: Plain text at `PLAIN_WIDTH`: what pipes, files and tests get.
PLAIN = Look()


def look_for(stream: TextIO) -> Look:
    """A terminal's own width (and bold headers unless NO_COLOR is set); plain text elsewhere."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        terminal = False
    if not terminal:
        return PLAIN
    columns = shutil.get_terminal_size((PLAIN_WIDTH, 24)).columns
    return Look(width=max(40, min(columns, MAX_WIDTH)), color="NO_COLOR" not in os.environ)


def table_lines(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    look: Look,
    indent: int = 2,
    right: Sequence[int] = (),
) -> list[str]:
    """A table as lines of text, `indent` spaces in: no borders, so each line reads as the row
    it is; columns in `right` are right-aligned (numbers); a cell too long for its column wraps
    inside it. Cells are plain text (never rich markup), so `[cpu_op]` stays as written, and
    their control characters are shown as escapes (`printable`): only the header's bold, which
    teller writes, reaches the terminal as a code."""
    table = Table(
        box=None,
        show_header=bool(header),
        header_style="bold" if look.color else "",
        pad_edge=False,
        padding=(0, COLUMN_GAP, 0, 0),
    )
    for k, title in enumerate(header or [""] * (len(rows[0]) if rows else 0)):
        table.add_column(Text(title), justify="right" if k in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(Text(printable(cell, one_line=True)) for cell in row))
    return [" " * indent + line for line in _render(table, look, look.width - indent)]


def _render(renderable: Table, look: Look, width: int) -> list[str]:
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=max(width, 20),
        color_system="standard" if look.color else None,
        force_terminal=look.color,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=False,
    )
    console.print(renderable)
    return [line.rstrip() for line in buffer.getvalue().splitlines()]


def wrapped(lead: str, text: str, look: Look, max_lines: int | None = None) -> list[str]:
    """`text` wrapped after `lead`, continued under its first word; words are never broken (a
    kernel name stays whole, on a line of its own if it must). With `max_lines`, what does not
    fit ends in ' …' at a space. Control characters in `text` (a name or a log line from an
    input file) are shown as escapes (`printable`), never acted on."""
    return textwrap.wrap(
        printable(text, one_line=True),
        look.width,
        initial_indent=lead,
        subsequent_indent=" " * len(lead),
        break_long_words=False,
        break_on_hyphens=False,
        max_lines=max_lines,
        placeholder=" …",
    ) or [lead.rstrip()]


def wrapped_items(lead: str, items: Sequence[str], look: Look, separator: str = ", ") -> list[str]:
    """`items` joined by `separator` and wrapped between items only (an item such as
    'kernel 413' stays on one line); control characters are shown as escapes."""
    lines: list[str] = []
    current = lead
    indent = " " * len(lead)
    for k, item in enumerate(items):
        piece = printable(item, one_line=True) + (separator.rstrip() if k < len(items) - 1 else "")
        gap = "" if current in (lead, indent) else " "
        if current not in (lead, indent) and len(current) + len(gap) + len(piece) > look.width:
            lines.append(current)
            current, gap = indent, ""
        current += gap + piece
    lines.append(current)
    return lines
