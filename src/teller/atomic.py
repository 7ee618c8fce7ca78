"""Atomic file writes: a reader (or a crash) never sees half a file at the final path.

Every output teller writes — event tables, labels, manifests, vocabularies, reports — goes through
here, so "nothing half-written" is one mechanism, not five copies of it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on error it vanishes.

    The file gets ordinary permissions (umask applied), not mkstemp's private 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_pieces_atomic(path, (text,))


def write_pieces_atomic(path: str | Path, pieces: Iterable[str]) -> Path:
    """`write_text_atomic` for text that comes in pieces (a report encoded as it is written):
    no piece is held after it is written, and an error while they come leaves no file."""
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as out:
        out.writelines(pieces)
    return Path(path)
