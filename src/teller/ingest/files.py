"""Opening an input file, and the boundary every reader keeps: whatever the file holds, the caller
gets a table or a TraceError that names the file and what was expected, never another exception."""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from teller.errors import TraceError

#: File names of Nsight Systems reports (`.qdrep` before 2021.3), read through `nsys export`.
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def read_bytes(path: Path, expected: str, size: int = -1) -> bytes:
    """The file's first `size` bytes (all of them by default).

    A missing file, a directory or a file the OS will not read raises TraceError; `expected` names
    what the reader wanted instead of a directory ("a trace file").
    """
    try:
        with path.open("rb") as handle:
            return handle.read(size)
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, f"is a directory, expected {expected}") from None
    except OSError as error:
        raise TraceError(path, f"cannot read: {error.strerror}") from None


#: What a malformed value can raise deep inside a reader (numpy casts, int(), a C decoder's depth
#: limit, a corrupt stream). Readers check what they expect first; this is the net under them.
_MALFORMED_VALUE_ERRORS = (
    ValueError,
    TypeError,
    OverflowError,
    RecursionError,
    KeyError,
    IndexError,
    AttributeError,
    UnicodeError,
    EOFError,
    zlib.error,
    sqlite3.Error,
)


@contextmanager
def guard_reader(path: Path, expected: str) -> Iterator[None]:
    """Turn any exception a malformed value raises inside a reader into a TraceError on `path`.

    The reader's own checks give the precise place (event, row, line); this names at least the
    file, what was expected, and the value's complaint, so no input reaches the user as a
    traceback."""
    try:
        yield
    except TraceError:
        raise
    except RecursionError:
        raise TraceError(path, f"nested too deeply to read; expected {expected}") from None
    except _MALFORMED_VALUE_ERRORS as error:
        raise TraceError(
            path,
            f"malformed value ({type(error).__name__}: {str(error)[:120]}); expected {expected}",
        ) from None
