"""Running one hostile variant: it must end in a result or a TellerError, within a time limit.

Anything else (another exception type, a hang) is a crash, recorded with the operator and index
that made the variant so the report says how to replay it.
"""

from __future__ import annotations

import signal
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from teller.errors import TellerError

#: Seconds one variant may take (the seed slices read in well under a second).
VARIANT_LIMIT_S = 20


class VariantTimeout(Exception):
    """A variant ran past VARIANT_LIMIT_S: a hang, which counts as a crash."""


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise VariantTimeout(f"ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Tally:
    """What the variants of one run came to: read, refused clearly, or crashed (with how)."""

    read: int = 0
    refused: int = 0
    crashes: list[str] = field(default_factory=list)

    @property
    def variants(self) -> int:
        return self.read + self.refused + len(self.crashes)

    def run(self, label: str, action: Callable[[], object]) -> object | None:
        """Run `action`; a result counts as read, a TellerError as refused, anything else as a
        crash described by `label`, the exception and where it was raised."""
        try:
            with time_limit(VARIANT_LIMIT_S):
                result = action()
        except TellerError:
            self.refused += 1
            return None
        except Exception as error:  # the point of the suite: any other type is a crash
            frame = traceback.extract_tb(error.__traceback__)[-1]
            self.crashes.append(
                f"{label}: {type(error).__name__}: {str(error)[:120]} "
                f"({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
            )
            return None
        self.read += 1
        return result

    def summary(self) -> str:
        shown = "\n".join(self.crashes[:20])
        return f"{self.variants} variants: {self.read} read, {self.refused} refused, " + (
            f"{len(self.crashes)} crashes:\n{shown}" if self.crashes else "0 crashes"
        )
