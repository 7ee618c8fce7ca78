"""The one error type every reader raises, so the CLI can turn any bad input into one clear line.

A user who feeds teller a broken file needs three facts to fix it: which file, where in it, and what
was expected there. Every reader raises `TraceError` with exactly those three, and nothing else
escapes a reader for bad input.
"""

from __future__ import annotations

from pathlib import Path


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
        super().__init__(location + what)
