"""The lab's rendezvous store listens on the run's own address only, never on every interface."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from teller.lab.serve.config import ServeConfig
from teller.lab.serve.worker import rendezvous_store

LISTEN = "0A"


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on `port`, from /proc/net/tcp and tcp6."""
    found = set()
    for table in ("tcp", "tcp6"):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == LISTEN and int(port_hex, 16) == port:
                found.add(_address(address))
    return found


def _address(hex_address: str) -> str:
    packed = bytes.fromhex(hex_address)
    if len(packed) == 4:
        return socket.inet_ntop(socket.AF_INET, packed[::-1])
    words = b"".join(packed[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_rank_zero_serves_the_store_on_loopback_only(tmp_path: Path) -> None:
    config = ServeConfig(run_dir=str(tmp_path), tp=1, master_port=_free_port())
    store = rendezvous_store(config, rank=0)
    store.set("t0_ns", "1")
    assert store.get("t0_ns") == b"1"
    assert _listening_addresses(config.master_port) == {"127.0.0.1"}
