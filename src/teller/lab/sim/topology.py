"""Cluster topology: which rank sits on which node and GPU, its process groups, and link speeds.

A replica (one serving engine) spans `tp × pp` ranks: tensor parallelism inside a stage, pipeline
stages one after another. Replicas are data-parallel copies and share no collectives, which is what
lets the simulator run them independently (one process each).

Link speeds are the only numbers typed in by hand (everything else is calibrated), from vendor
specifications of an H100 SXM cluster:
* NVLink 4: 900 GB/s total bidirectional per H100 SXM (NVIDIA H100 datasheet) → 450 GB/s each way;
* network: one 400 Gb/s NDR InfiniBand NIC per GPU (ConnectX-7, DGX H100 reference) → 50 GB/s;
* per-hop latencies of a few µs, the order of NCCL's own tuning-model base latencies for the
  LL protocol intra-node and over IB.
"""

from __future__ import annotations

from dataclasses import dataclass

NVLINK_BYTES_PER_NS = 450.0  # 450 GB/s = 450 bytes/ns
NETWORK_BYTES_PER_NS = 50.0  # 400 Gb/s
NVLINK_LATENCY_NS = 3_000
NETWORK_LATENCY_NS = 8_000


@dataclass(frozen=True)
class ProcessGroup:
    """A process group as PyTorch names it in `distributedInfo.pg_config` and record_param_comms."""

    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    nvlink_bytes_per_ns: float = NVLINK_BYTES_PER_NS
    network_bytes_per_ns: float = NETWORK_BYTES_PER_NS
    nvlink_latency_ns: int = NVLINK_LATENCY_NS
    network_latency_ns: int = NETWORK_LATENCY_NS

    def __post_init__(self) -> None:
        if min(self.nodes, self.gpus_per_node, self.tp, self.pp) < 1:
            raise ValueError("nodes, gpus per node, tp and pp must all be at least 1")
        if min(self.nvlink_bytes_per_ns, self.network_bytes_per_ns) <= 0:
            raise ValueError("link bandwidths must be positive")
        if min(self.nvlink_latency_ns, self.network_latency_ns) < 0:
            raise ValueError("link latencies cannot be negative")
        if self.world_size % (self.tp * self.pp):
            raise ValueError(
                f"tp × pp = {self.tp * self.pp} does not divide the {self.world_size} GPUs"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def replica_size(self) -> int:
        return self.tp * self.pp

    @property
    def replicas(self) -> int:
        return self.world_size // self.replica_size

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_gpu(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def rank_of(self, replica: int, stage: int, tp_index: int) -> int:
        return replica * self.replica_size + stage * self.tp + tp_index

    def replica_ranks(self, replica: int) -> list[int]:
        return list(range(replica * self.replica_size, (replica + 1) * self.replica_size))

    def stage_ranks(self, replica: int, stage: int) -> list[int]:
        return [self.rank_of(replica, stage, t) for t in range(self.tp)]

    def groups(self) -> list[ProcessGroup]:
        """Every process group in creation order, so names agree on all ranks (as in PyTorch)."""
        groups = [ProcessGroup("0", "default_pg", tuple(range(self.world_size)))]
        for replica in range(self.replicas):
            for stage in range(self.pp):
                ranks = tuple(self.stage_ranks(replica, stage))
                groups.append(ProcessGroup(str(len(groups)), "tp", ranks))
        for replica in range(self.replicas):
            for t in range(self.tp):
                ranks = tuple(self.rank_of(replica, s, t) for s in range(self.pp))
                groups.append(ProcessGroup(str(len(groups)), "pp", ranks))
        return groups

    def groups_of(self, rank: int) -> list[ProcessGroup]:
        return [g for g in self.groups() if rank in g.ranks]

    def link(self, a: int, b: int) -> tuple[float, int]:
        """(bytes per ns, latency ns) of the path between two ranks."""
        if self.node_of(a) == self.node_of(b):
            return self.nvlink_bytes_per_ns, self.nvlink_latency_ns
        return self.network_bytes_per_ns, self.network_latency_ns
