"""net_throttle: a token-bucket (tbf) rate limit on the guilty rank's veth, both directions.

The rank's egress is shaped inside its namespace and its ingress on the bridge-side peer, so every
collective it takes part in is limited by the link: transfer time grows with message size (prefill
all-reduces carry more bytes than decode ones). tbf only, no netem. Rate = max(1, 200 *
(1 - intensity)) Mbit/s.
"""

from __future__ import annotations

import subprocess

from teller.errors import TellerError
from teller.lab.faults.os_fault import RankTarget

#: Bucket and queue sizes: deep enough that TCP is slowed rather than dropped into timeouts.
BURST = "32kb"
QUEUE_LIMIT = "4mb"


def rate_mbit(intensity: float) -> float:
    return max(1.0, 200.0 * (1.0 - intensity))


class NetThrottle:
    def __init__(self, target: RankTarget, intensity: float) -> None:
        if target.namespace is None or target.rank_link is None or target.host_link is None:
            raise TellerError("net_throttle needs each rank in its own network namespace (root)")
        self.target = target
        self.rate = f"{rate_mbit(intensity):.0f}mbit"
        self.applied: list[list[str]] = []

    def _devices(self) -> list[list[str]]:
        return [
            ["-n", self.target.namespace, "qdisc", "%s", "dev", self.target.rank_link],
            ["qdisc", "%s", "dev", self.target.host_link],
        ]

    def apply(self) -> None:
        for device in self._devices():
            command = ["tc", *[("add" if a == "%s" else a) for a in device]]
            command += ["root", "tbf", "rate", self.rate, "burst", BURST, "limit", QUEUE_LIMIT]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise TellerError(f"{' '.join(command)} failed: {done.stderr.strip()}")
            self.applied.append(device)

    def revert(self) -> None:
        for device in self.applied:
            command = ["tc", *[("del" if a == "%s" else a) for a in device], "root"]
            subprocess.run(command, capture_output=True)
        self.applied.clear()
