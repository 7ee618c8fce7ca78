"""One network namespace per rank, joined by veth pairs on a bridge, so rank↔rank traffic crosses a link.

This is "multi-node on one machine": each rank's collectives leave its namespace through its own
veth, where `tc` can shape them (net_throttle). Addresses are private and exist only inside our
namespaces; the bridge has no address, so nothing outside them is reachable or changed.
Needs root; `lab_network` removes everything it made, on success, error or interrupt.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from teller.errors import TellerError

#: Private subnet inside the lab namespaces; rank r gets .(r + 1).
SUBNET_PREFIX = "10.213.0."
SUBNET_BITS = 24


@dataclass
class LabNetwork:
    tag: str
    namespaces: list[str]
    rank_links: list[str]  # interface inside each rank's namespace (gloo binds to it)
    host_links: list[str]  # the veth peer on the bridge, in the root namespace
    addresses: list[str]
    bridge: str


def is_root() -> bool:
    return os.geteuid() == 0


def require_root(what: str) -> None:
    if not is_root():
        raise TellerError(
            f"{what} needs root (network namespaces, tc and cgroups); run as root, "
            "or choose a fault that does not (none, cpu_contention, slow_operator, "
            "scheduler_misconfig, host_stall, workload_shift)"
        )


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise TellerError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


@contextlib.contextmanager
def lab_network(ranks: int, tag: str | None = None) -> Iterator[LabNetwork]:
    """Create the namespaces, veths and bridge for `ranks` ranks; remove them on exit."""
    require_root("a namespace per rank")
    tag = tag or f"tl{os.getpid() % 100000}"
    network = LabNetwork(
        tag=tag,
        namespaces=[f"teller-{tag}-{r}" for r in range(ranks)],
        rank_links=[f"{tag}r{r}" for r in range(ranks)],
        host_links=[f"{tag}h{r}" for r in range(ranks)],
        addresses=[f"{SUBNET_PREFIX}{r + 1}" for r in range(ranks)],
        bridge=f"{tag}br",
    )
    try:
        _ip("link", "add", network.bridge, "type", "bridge")
        _ip("link", "set", network.bridge, "up")
        for r in range(ranks):
            namespace, inside, outside = (
                network.namespaces[r],
                network.rank_links[r],
                network.host_links[r],
            )
            _ip("netns", "add", namespace)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", namespace)
            _ip("link", "set", outside, "master", network.bridge)
            _ip("link", "set", outside, "up")
            _ip(
                "-n",
                namespace,
                "addr",
                "add",
                f"{network.addresses[r]}/{SUBNET_BITS}",
                "dev",
                inside,
            )
            _ip("-n", namespace, "link", "set", inside, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
        yield network
    finally:
        remove(network)


def remove(network: LabNetwork) -> None:
    """Delete what `lab_network` made; deleting a namespace deletes the veth pair in it."""
    for namespace in network.namespaces:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    for link in [*network.host_links, network.bridge]:
        subprocess.run(["ip", "link", "del", link], capture_output=True)


def leftovers(tag: str) -> list[str]:
    """Namespaces and links of `tag` that still exist (for tests of the clean-up)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found = [line.split()[0] for line in names.splitlines() if f"-{tag}-" in line]
    found += [
        line.split(":")[1].strip().split("@")[0]
        for line in links.splitlines()
        if line.split(":")[1].strip().startswith(tag)
    ]
    return found
