"""A cgroup per rank for CPU quota (straggler) and memory limits (memory_pressure).

Works on cgroup v2 (`cpu.max`, `memory.high`) and, where the machine still mounts v1 (this lab
machine does), on v1 (`cpu.cfs_quota_us`, `memory.limit_in_bytes`; v1 has no `memory.high`, so the
hard limit is set just above the rank's anonymous memory, which forces reclaim of its file-backed
pages without an OOM kill). `rank_cgroups` removes every group it made, moving processes back first.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from teller.errors import TellerError

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
#: How long removing a rank's group keeps retrying while its last processes exit.
REMOVE_WAIT_S = 5.0
REMOVE_PAUSE_S = 0.05


def cgroup_version() -> int:
    """2 for a unified hierarchy at /sys/fs/cgroup, 1 for v1 controllers, 0 for none usable."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return 2
    if (CGROUP_ROOT / "cpu").is_dir() and (CGROUP_ROOT / "memory").is_dir():
        return 1
    return 0


def _own_path(controller: str) -> Path:
    """Where this process sits in a v1 controller's hierarchy (groups are made beneath it)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/")
    return CGROUP_ROOT / controller


@dataclass
class RankCgroup:
    """The cgroup(s) of one rank process: one directory on v2, one per controller on v1."""

    version: int
    cpu_dir: Path
    memory_dir: Path

    def procs_files(self) -> list[str]:
        """The files a process writes its pid into to join (one per v1 controller)."""
        return [str(d / "cgroup.procs") for d in sorted({self.cpu_dir, self.memory_dir})]

    def add(self, pid: int) -> None:
        """Move the whole process (all its threads) into the group."""
        if self.version == 1:
            # carry the process's pages along where the kernel still allows it (deprecated in 6.x)
            with contextlib.suppress(OSError):
                (self.memory_dir / "memory.move_charge_at_immigrate").write_text("3")
        for directory in {self.cpu_dir, self.memory_dir}:
            _write(directory / "cgroup.procs", str(pid))

    def set_cpu_weight(self, shares: int) -> None:
        """Relative CPU weight against other groups (v1 cpu.shares; v2 cpu.weight, 1024 → 100)."""
        if self.version == 2:
            _write(self.cpu_dir / "cpu.weight", str(max(1, min(10_000, shares * 100 // 1024))))
        else:
            _write(self.cpu_dir / "cpu.shares", str(shares))

    def set_cpu_share(self, share: float) -> None:
        """Cap the rank at `share` of one CPU (None-like 1.0+ lifts the cap)."""
        quota_us = int(CPU_PERIOD_US * share)
        if self.version == 2:
            value = "max" if share >= 1 else f"{quota_us} {CPU_PERIOD_US}"
            _write(self.cpu_dir / "cpu.max", value)
        else:
            _write(self.cpu_dir / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(self.cpu_dir / "cpu.cfs_quota_us", "-1" if share >= 1 else str(quota_us))

    def set_oom_kill(self, enabled: bool) -> None:
        """v1 only: with the OOM killer off, a group at its limit waits instead of being killed."""
        if self.version == 1:
            _write(self.memory_dir / "memory.oom_control", "0" if enabled else "1")

    def memory_stat(self) -> dict[str, int]:
        lines = (self.memory_dir / "memory.stat").read_text().splitlines()
        return {key: int(value) for key, value in (line.split() for line in lines)}

    def memory_usage_bytes(self) -> int:
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return int((self.memory_dir / name).read_text())

    def set_memory_limit(self, limit_bytes: int | None) -> None:
        """Throttle (v2 memory.high) or cap (v1 limit) the rank's memory; None lifts it."""
        if self.version == 2:
            value = "max" if limit_bytes is None else str(limit_bytes)
            _write(self.memory_dir / "memory.high", value)
        else:
            value = "-1" if limit_bytes is None else str(limit_bytes)
            _write(self.memory_dir / "memory.limit_in_bytes", value)

    def remove(self, wait_s: float = REMOVE_WAIT_S) -> None:
        """Move what is left back to the parent group and remove the group(s).

        A rank killed a moment ago (its launcher died) is still listed while it exits, and the
        kernel refuses to remove a group with a task in it (EBUSY), so the removal is retried
        until `wait_s` has passed; what is still there then is left to the run's final sweep."""
        deadline = time.monotonic() + wait_s
        for directory in {self.cpu_dir, self.memory_dir}:
            while directory.is_dir():
                parent_procs = directory.parent / "cgroup.procs"
                procs = directory / "cgroup.procs"
                for pid in procs.read_text().split() if procs.exists() else []:
                    with contextlib.suppress(OSError):  # the process may have exited
                        parent_procs.write_text(pid)
                try:
                    directory.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(REMOVE_PAUSE_S)


@contextlib.contextmanager
def rank_cgroups(ranks: int, tag: str | None = None) -> Iterator[list[RankCgroup]]:
    """Make one cgroup per rank; remove them all on exit."""
    version = cgroup_version()
    if os.geteuid() != 0 or version == 0:
        raise TellerError(
            "per-rank cgroups need root and a writable cgroup v1 or v2 hierarchy at /sys/fs/cgroup"
        )
    tag = tag or f"tl{os.getpid() % 100000}"
    groups: list[RankCgroup] = []
    try:
        for r in range(ranks):
            name = f"teller-{tag}-{r}"
            if version == 2:
                directory = _v2_parent() / name
                directory.mkdir()
                group = RankCgroup(2, directory, directory)
            else:
                group = RankCgroup(1, _own_path("cpu") / name, _own_path("memory") / name)
                group.cpu_dir.mkdir()
                group.memory_dir.mkdir()
            groups.append(group)
        yield groups
    finally:
        for group in groups:
            group.remove()


def _write(path: Path, value: str) -> None:
    """Write one cgroup interface file; a refusal becomes an error naming the file and value."""
    try:
        path.write_text(value)
    except OSError as error:
        if error.errno == errno.EBUSY:
            raise  # v1 refuses a limit below usage for now: callers step towards it and retry
        raise TellerError(f"cannot write {value!r} to {path}: {error.strerror or error}") from None


V2_CONTROLLERS = ("cpu", "memory")


def _v2_parent() -> Path:
    """The v2 group to make rank groups in, with the cpu and memory controllers enabled for them.

    On v2 a child only gets `cpu.*`/`memory.*` files once its parent lists the controllers in
    `cgroup.subtree_control`. A non-root group that holds processes (ours, usually) may not
    enable them (the "no internal processes" rule: EBUSY), so the hierarchy's root, which is
    exempt, is the fallback; if neither accepts, the error says which file refused.
    """
    candidates = [_own_path_v2()]
    if CGROUP_ROOT not in candidates:
        candidates.append(CGROUP_ROOT)
    refusals = []
    for parent in candidates:
        try:
            _enable_v2_controllers(parent)
            return parent
        except TellerError as error:
            refusals.append(str(error))
    raise TellerError("cannot enable cpu and memory for per-rank cgroups: " + "; ".join(refusals))


def _enable_v2_controllers(parent: Path) -> None:
    available = (parent / "cgroup.controllers").read_text().split()
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        raise TellerError(f"{parent / 'cgroup.controllers'} lacks {' '.join(missing)}")
    subtree = parent / "cgroup.subtree_control"
    enabled = subtree.read_text().split() if subtree.exists() else []
    wanted = [c for c in V2_CONTROLLERS if c not in enabled]
    if wanted:
        _write(subtree, " ".join(f"+{c}" for c in wanted))


def _own_path_v2() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return CGROUP_ROOT / line[3:].lstrip("/")
    return CGROUP_ROOT
