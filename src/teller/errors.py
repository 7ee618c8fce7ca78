"""The one error type every reader raises, so the CLI can turn any bad input into one clear line.

A user who feeds teller a broken file needs three facts to fix it: which file, where in it, and what
was expected there. Every reader raises `TraceError` with exactly those three, and nothing else
escapes a reader for bad input.
"""

from __future__ import annotations

from pathlib import Path

#: Characters a terminal acts on instead of showing: C0/C1 controls (ESC starts colour, cursor and
#: title sequences), DEL, the bidirectional overrides that reorder what is shown, and lone
#: surrogates (which cannot be printed at all). Newlines and tabs are kept.
_UNPRINTABLE = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in (
        *range(0x00, 0x20),
        *range(0x7F, 0xA0),
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
        *range(0xD800, 0xE000),
    )
    if chr(code) not in "\n\t"
}
_ONE_LINE = {**_UNPRINTABLE, ord("\n"): "\\n", ord("\t"): "\\t"}


def printable(text: str, one_line: bool = False) -> str:
    """`text` with every character a terminal would act on written as an escape (`\\x1b`), so
    names and log lines from an input file are shown, never executed; `one_line` escapes
    newlines and tabs too."""
    return text.translate(_ONE_LINE if one_line else _UNPRINTABLE)


class TellerError(Exception):
    """Base class of the errors teller reports to users as one line (exit status 2)."""


class TraceError(TellerError):
    """A trace or log file that cannot be read: names the file, the place in it, and what was wrong.

    `where` is a human-readable position such as ``"byte 1234"`` or ``"event 17"``; it is empty when
    the problem concerns the file as a whole (missing, empty).
    """

    def __init__(self, path: str | Path, what: str, where: str = "") -> None:
        self.path = str(path)
        self.where = where
        self.what = what
        location = f"{self.path}: {where}: " if where else f"{self.path}: "
        super().__init__(printable(location + what, one_line=True))
