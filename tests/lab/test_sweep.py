"""The stale-resource sweep: what a killed lab run left is removed by its tag, and nothing else.

The cgroup half runs on a stand-in hierarchy in a temporary folder; the network half (marked
`lab`: root and `ip`) makes a namespace, a veth pair and a bridge under a tag no process holds,
and sweeps only that tag, so a concurrent lab run's resources are never touched.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from teller.lab import netns
from teller.lab.sweep import stale_cgroups, sweep

DEAD = "tl99999"


def test_only_groups_of_tags_no_process_holds_are_stale(tmp_path: Path) -> None:
    for group in (
        "cpu/teller-tl7-0",
        "memory/process_api/abc/teller-tl7-1",
        "cpu/teller-tl8-0",
        "cpu/not-teller-tl7-0",
        "cpu/teller-tl7-x",
    ):
        (tmp_path / group).mkdir(parents=True)
    stale = stale_cgroups(tmp_path, lambda tag: tag == "tl7")
    assert sorted(str(p.relative_to(tmp_path)) for p in stale) == [
        "cpu/teller-tl7-0",
        "memory/process_api/abc/teller-tl7-1",
    ]
    swept = sweep(cgroup_root=tmp_path, live={"tl8"}, tags={"tl7", "tl8"})
    assert sorted(Path(p).name for p in swept.cgroups) == ["teller-tl7-0", "teller-tl7-1"]
    assert (tmp_path / "cpu/teller-tl8-0").is_dir()  # a live run's group stays
    assert (tmp_path / "cpu/not-teller-tl7-0").is_dir()


@pytest.mark.lab
@pytest.mark.skipif(not netns.is_root() or shutil.which("ip") is None, reason="needs root and ip")
def test_a_dead_runs_namespace_links_and_bridge_are_swept(tmp_path: Path) -> None:
    namespace, host, inside, bridge = f"teller-{DEAD}-0", f"{DEAD}h0", f"{DEAD}r0", f"{DEAD}br"
    try:
        for command in (
            ["ip", "link", "add", bridge, "type", "bridge"],
            ["ip", "netns", "add", namespace],
            ["ip", "link", "add", host, "type", "veth", "peer", "name", inside],
            ["ip", "link", "set", inside, "netns", namespace],
            ["ip", "link", "set", host, "master", bridge],
            [
                "tc",
                "qdisc",
                "add",
                "dev",
                host,
                "root",
                "tbf",
                "rate",
                "1mbit",
                "burst",
                "32kb",
                "limit",
                "64kb",
            ],
        ):
            subprocess.run(command, check=True, capture_output=True)
        assert netns.leftovers(DEAD)
        swept = sweep(cgroup_root=tmp_path, live=set(), tags={DEAD})
        assert swept.namespaces == [namespace]
        assert bridge in swept.links  # the veth pair (and its qdisc) went with the namespace
        assert netns.leftovers(DEAD) == []
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        for link in (host, bridge):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
