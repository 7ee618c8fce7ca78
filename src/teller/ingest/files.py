"""Opening a trace file: what the OS refuses, as a TraceError that says what the reader expected."""

from __future__ import annotations

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
