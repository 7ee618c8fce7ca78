"""Stale lab resources: what a killed `teller lab run` left behind, found by its tag and removed.

A run names everything it makes after its tag, `tl<pid % 100000>`: namespaces and cgroups
`teller-<tag>-<rank>`, links `<tag>r<rank>` / `<tag>h<rank>` and the bridge `<tag>br` (tc
qdiscs live on those links and go with them). SIGINT and SIGTERM clean up in the run itself; a
SIGKILL cannot, so the run's guard process (`teller.lab.guard`) sweeps its tag as soon as the run
dies, every run sweeps first (what a killed guard left), and `teller lab clean` sweeps on demand.
Only tags whose run is gone are touched: a tag is live while any process has that pid modulo 100000, so a
concurrent run's resources stay.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from teller.lab.cgroups import CGROUP_ROOT

_TAG = r"tl\d{1,5}"
_NAMESPACE = re.compile(rf"^teller-({_TAG})-\d+$")
_LINK = re.compile(rf"^({_TAG})(?:r\d+|h\d+|br)$")
#: How deep below /sys/fs/cgroup rank groups are looked for (they sit beside the lab process).
_CGROUP_DEPTH = 6
#: How long a killed group's processes get to exit before the group is removed.
_EXIT_WAIT_S = 2.0


@dataclass
class Swept:
    """What one sweep removed (names), and what it could not (with why)."""

    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def removed(self) -> int:
        return len(self.namespaces) + len(self.links) + len(self.cgroups)


def live_tags() -> set[str]:
    """Tags of the runs that may still be running: one per process id alive now."""
    return {f"tl{int(p) % 100000}" for p in os.listdir("/proc") if p.isdigit()}


def sweep(
    cgroup_root: Path = CGROUP_ROOT, live: set[str] | None = None, tags: set[str] | None = None
) -> Swept:
    """Remove every teller lab namespace, link and cgroup whose tag is not live (of `tags`
    only, when given: a test sweeps just what it made)."""
    live = live_tags() if live is None else live

    def stale(tag: str) -> bool:
        return tag not in live and (tags is None or tag in tags)

    swept = Swept()
    for name in _names(["ip", "netns", "list"]):
        match = _NAMESPACE.match(name)
        if match and stale(match.group(1)):
            for pid in _names(["ip", "netns", "pids", name]):
                _kill(int(pid), swept)
            _run(["ip", "netns", "del", name], name, swept.namespaces, swept)
    for link in _links():
        match = _LINK.match(link)
        if match and stale(match.group(1)):
            _run(["ip", "link", "del", link], link, swept.links, swept)
    for directory in stale_cgroups(cgroup_root, stale):
        _remove_cgroup(directory, swept)
    return swept


def stale_cgroups(cgroup_root: Path, stale: Callable[[str], bool]) -> list[Path]:
    """Rank cgroups (`teller-<tag>-<rank>`, v1 or v2) whose tag is `stale`, deepest first."""
    found: list[Path] = []
    if not cgroup_root.is_dir():
        return found
    base = len(cgroup_root.parts)
    for directory, children, _ in os.walk(cgroup_root):
        if len(Path(directory).parts) - base >= _CGROUP_DEPTH:
            children.clear()
        for child in children:
            match = _NAMESPACE.match(child)
            if match and stale(match.group(1)):
                found.append(Path(directory) / child)
    return sorted(found, key=lambda p: -len(p.parts))


def _remove_cgroup(directory: Path, swept: Swept) -> None:
    """Lift the memory limit and turn the OOM killer back on (a rank of the dead run may be
    stalled at its limit, where v1 with the OOM killer off would hold it), kill what still runs in
    it, wait a moment for it to exit, then remove the group."""
    for limit, value in (
        ("memory.high", "max"),
        ("memory.limit_in_bytes", "-1"),
        ("memory.oom_control", "0"),
    ):
        with contextlib.suppress(OSError):
            if (directory / limit).exists():
                (directory / limit).write_text(value)
    kill_file = directory / "cgroup.kill"
    if kill_file.exists():
        with contextlib.suppress(OSError):
            kill_file.write_text("1")
    for pid in _cgroup_pids(directory):
        _kill(pid, swept)
    deadline = time.monotonic() + _EXIT_WAIT_S
    while _cgroup_pids(directory) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        directory.rmdir()
    except OSError as error:
        swept.failed.append(f"{directory}: {error.strerror}")
    else:
        swept.cgroups.append(str(directory))


def _cgroup_pids(directory: Path) -> list[int]:
    try:
        return [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _kill(pid: int, swept: Swept) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
        swept.killed.append(pid)


def _names(command: list[str]) -> list[str]:
    """First word of each output line (`ip netns list` adds "(id: N)")."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    except OSError:
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    try:
        out = subprocess.run(
            ["ip", "-o", "link", "show"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return []
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            names.append(parts[1].strip().split("@")[0])
    return names


def _run(command: list[str], name: str, removed: list[str], swept: Swept) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        removed.append(name)
    else:
        swept.failed.append(f"{name}: {done.stderr.strip()}")
