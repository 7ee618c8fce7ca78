"""What an OS-level fault acts on, and the apply/revert shape every such fault has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from teller.lab.cgroups import RankCgroup


@dataclass
class RankTarget:
    """One rank process as the OS sees it: pid, pinned core, cgroup, and its network link."""

    rank: int
    pid: int
    core: int | None
    cgroup: RankCgroup | None
    namespace: str | None
    rank_link: str | None  # veth inside the rank's namespace
    host_link: str | None  # its peer on the bridge


class OsFault(Protocol):
    """Applied when the window opens and reverted when it closes (or on any exit)."""

    def apply(self) -> None: ...

    def revert(self) -> None: ...
