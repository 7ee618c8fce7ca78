"""Glue between `teller lab sim` and the simulator: options → SimConfig → a case on disk."""

from __future__ import annotations

import argparse
import os

from teller.errors import TellerError
from teller.lab.sim.engine import EngineConfig, WorkloadConfig
from teller.lab.sim.faults import SIM_FAULTS, FaultSpec
from teller.lab.sim.run import SimConfig, SimResult, simulate
from teller.lab.sim.topology import (
    NETWORK_BYTES_PER_NS,
    NETWORK_LATENCY_NS,
    NVLINK_BYTES_PER_NS,
    NVLINK_LATENCY_NS,
    Topology,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="case directory to create (new or empty)")
    parser.add_argument("--nodes", type=int, default=1, help="machines in the cluster (1)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per machine (8)")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel ranks per stage")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages")
    parser.add_argument("--steps", type=int, default=50, help="engine steps to simulate")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers in the model")
    parser.add_argument(
        "--fault", choices=SIM_FAULTS, default="none", help="fault to inject (default none)"
    )
    parser.add_argument("--rank", type=int, default=0, help="guilty rank")
    parser.add_argument("--peer", type=int, default=-1, help="link_contention: the other rank")
    parser.add_argument(
        "--intensity", type=float, default=1.0, help="how strong the fault is, 0 or more (1)"
    )
    parser.add_argument(
        "--variant",
        choices=("kernel_swap", "graph_fallback"),
        default="",
        help="kernel_regression: swap a GEMM kernel (default) or lose CUDA graphs",
    )
    parser.add_argument("--window", default=None, help="fault window A:B in step ordinals")
    parser.add_argument("--seed", type=int, default=0, help="workload and noise seed")
    parser.add_argument(
        "--model", default=None, help="served model id in the spans (default: the calibrated one)"
    )
    parser.add_argument("--no-python", action="store_true", help="no python_function frames")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs for decode")
    links = parser.add_argument_group("links (defaults: H100 NVLink 4, 400 Gb/s InfiniBand)")
    links.add_argument(
        "--nvlink-gbps", type=float, default=NVLINK_BYTES_PER_NS, help="GB/s between GPUs of a node"
    )
    links.add_argument(
        "--network-gbps", type=float, default=NETWORK_BYTES_PER_NS, help="GB/s between nodes"
    )
    links.add_argument(
        "--nvlink-latency-us",
        type=float,
        default=NVLINK_LATENCY_NS / 1000,
        help="latency between GPUs of a node, µs",
    )
    links.add_argument(
        "--network-latency-us",
        type=float,
        default=NETWORK_LATENCY_NS / 1000,
        help="latency between nodes, µs",
    )
    parser.add_argument(
        "--max-batched-tokens", type=int, default=2048, help="the scheduler's tokens per step"
    )
    parser.add_argument(
        "--max-seqs", type=int, default=64, help="the scheduler's requests per step"
    )
    parser.add_argument(
        "--kv-blocks", type=int, default=4096, help="KV-cache blocks the engine has"
    )
    parser.add_argument("--rate", type=float, default=100.0, help="request arrivals per second")
    parser.add_argument(
        "--jobs", type=int, default=min(os.cpu_count() or 1, 8), help="replica processes"
    )


def parse_window(text: str | None, steps: int) -> tuple[int, int]:
    if text is None:
        return (0, steps)
    first, sep, last = text.partition(":")
    if not sep or not first.isdigit() or not last.isdigit() or int(last) <= int(first):
        raise TellerError(f"--window {text!r}: expected A:B with 0 <= A < B")
    return int(first), int(last)


def run_from_args(args: argparse.Namespace, progress: bool) -> SimResult:
    try:
        config = SimConfig(
            topology=Topology(
                args.nodes,
                args.gpus_per_node,
                args.tp,
                args.pp,
                nvlink_bytes_per_ns=args.nvlink_gbps,  # 1 GB/s is 1 byte/ns
                network_bytes_per_ns=args.network_gbps,
                nvlink_latency_ns=round(args.nvlink_latency_us * 1000),
                network_latency_ns=round(args.network_latency_us * 1000),
            ),
            steps=args.steps,
            layers=args.layers,
            python_frames=not args.no_python,
            engine=EngineConfig(
                max_num_seqs=args.max_seqs,
                max_num_batched_tokens=args.max_batched_tokens,
                kv_blocks=args.kv_blocks,
                cuda_graphs=not args.eager,
            ),
            workload=WorkloadConfig(rate_per_s=args.rate),
            fault=FaultSpec(
                args.fault,
                rank=args.rank,
                intensity=args.intensity,
                window=parse_window(args.window, args.steps),
                peer=args.peer,
                variant=args.variant,
            ),
            seed=args.seed,
            **({"model": args.model} if args.model else {}),
        )
    except ValueError as error:
        raise TellerError(f"{args.out}: {error}") from None
    return simulate(config, args.out, jobs=args.jobs, progress=progress)


def render(result: SimResult) -> str:
    labels = result.labels
    steps = sum(r.steps_done for r in result.replicas)
    lines = [
        f"case    {result.case_dir}",
        f"ranks   {sum(len(r.events_per_rank) for r in result.replicas)} in "
        f"{len(result.replicas)} replica(s), {steps} replica-steps, {result.events:,} events, "
        f"{result.seconds:.1f} s",
        f"fault   {labels.fault} (view {labels.view}), rank {labels.guilty_rank}, "
        f"operator {labels.guilty_operator}, steps {labels.steps[:1]}..{labels.steps[-1:]}",
    ]
    return "\n".join(lines)
