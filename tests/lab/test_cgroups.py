"""Per-rank cgroups on a fake cgroup v2 tree: the controllers are enabled before groups are made,
the root is the fallback when our own group refuses, and a refused write names its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from teller.errors import TellerError
from teller.lab import cgroups


def _fake_v2(root: Path, own: str, refuse_own: bool, monkeypatch) -> Path:
    """A v2 hierarchy at `root` with this process in `root/own`; `refuse_own` makes our own
    group answer EBUSY to subtree_control, as the kernel does for a group holding processes."""
    (root / own).mkdir(parents=True)
    for group in (root, root / own):
        (group / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (group / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", root)
    monkeypatch.setattr(cgroups, "_own_path_v2", lambda: root / own)
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 0)
    if refuse_own:
        real_write = cgroups._write

        def write(path: Path, value: str) -> None:
            if path == root / own / "cgroup.subtree_control":
                try:
                    raise OSError(16, "Device or resource busy")
                except OSError as error:
                    raise TellerError(
                        f"cannot write {value!r} to {path}: {error.strerror}"
                    ) from None
            real_write(path, value)

        monkeypatch.setattr(cgroups, "_write", write)
    return root / own


def test_v2_groups_are_made_where_cpu_and_memory_are_enabled(tmp_path, monkeypatch):
    own = _fake_v2(tmp_path / "cg", "user.slice/run.scope", False, monkeypatch)
    with cgroups.rank_cgroups(2, tag="t") as groups:
        assert (own / "cgroup.subtree_control").read_text() == "+cpu +memory"
        assert [g.cpu_dir for g in groups] == [own / "teller-t-0", own / "teller-t-1"]
        groups[1].set_cpu_share(0.25)
        assert (own / "teller-t-1" / "cpu.max").read_text() == "25000 100000"
        groups[0].set_memory_limit(64 << 20)
        assert (own / "teller-t-0" / "memory.high").read_text() == str(64 << 20)


def test_v2_falls_back_to_the_root_when_our_group_holds_processes(tmp_path, monkeypatch):
    root = tmp_path / "cg"
    _fake_v2(root, "user.slice/run.scope", True, monkeypatch)
    with cgroups.rank_cgroups(1, tag="t") as groups:
        assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory"
        assert groups[0].cpu_dir == root / "teller-t-0"


def test_v2_without_the_controllers_is_a_clear_error(tmp_path, monkeypatch):
    root = tmp_path / "cg"
    own = _fake_v2(root, "a", False, monkeypatch)
    for group in (root, own):
        (group / "cgroup.controllers").write_text("pids\n")
    with pytest.raises(TellerError, match="lacks cpu memory"), cgroups.rank_cgroups(1, tag="t"):
        pass
    assert not (own / "teller-t-0").exists()


def test_a_refused_interface_write_names_the_file(tmp_path):
    group = cgroups.RankCgroup(2, tmp_path / "missing", tmp_path / "missing")
    with pytest.raises(TellerError, match=r"cpu\.max"):
        group.set_cpu_share(0.5)
