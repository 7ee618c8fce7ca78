"""Start the ranks of one serving run and wait for them: `python -m teller.lab.serve.launch CFG`.

This is the command the collector runs for `teller lab run` and the body of `teller lab serve`.
Each rank is its own process (in its own network namespace and pinned to its own core when the
config says so). If one rank fails or the launcher is interrupted, the others are stopped too, so
no rank is left waiting at a collective.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from teller.lab.serve.config import ServeConfig

#: Grace period between SIGTERM and SIGKILL when stopping ranks.
STOP_GRACE_S = 5.0


def rank_command(config: ServeConfig, config_path: Path, rank: int) -> list[str]:
    command = [sys.executable, "-m", "teller.lab.serve.worker", str(config_path)]
    if config.cores:
        command = ["taskset", "-c", str(config.cores[rank % len(config.cores)]), *command]
    if config.netns:
        command = ["ip", "netns", "exec", config.netns[rank], *command]
    if config.cgroup_procs:
        # join the rank's cgroups first (inside its namespace /sys is remounted without them);
        # the shell's pid becomes the rank's, as `ip netns exec` and taskset exec in place
        joins = "".join(f'echo $$ > "{procs}"; ' for procs in config.cgroup_procs[rank])
        command = ["sh", "-c", joins + 'exec "$@"', "sh", *command]
    return command


def rank_env(config: ServeConfig, rank: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(config.tp),
        MASTER_ADDR=config.master_addr,
        MASTER_PORT=str(config.master_port),
        OMP_NUM_THREADS=str(config.threads_per_rank),
        TOKENIZERS_PARALLELISM="false",
    )
    if config.ifnames:
        env["GLOO_SOCKET_IFNAME"] = config.ifnames[rank]
    return env


def launch(config_path: str | Path) -> int:
    """Run every rank to completion; the first failing rank's exit status, else 0."""
    config_path = Path(config_path)
    config = ServeConfig.read(config_path)
    ranks = [
        subprocess.Popen(rank_command(config, config_path, r), env=rank_env(config, r))
        for r in range(config.tp)
    ]
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while True:
            codes = [p.poll() for p in ranks]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                stop_ranks(ranks)
                return failed[0]
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.1)
    finally:
        stop_ranks(ranks)
        signal.signal(signal.SIGTERM, previous)


def serve(
    out_dir: str | Path,
    tp: int = 2,
    duration_s: float = 10.0,
    rate_per_s: float = 6.0,
    seed: int = 0,
) -> int:
    """`teller lab serve`: run the workload standalone on loopback (no profiler, no fault).

    Ranks log to stdout; the ground truth lands in `out_dir/ground_truth/`.
    """
    import socket

    config = ServeConfig(run_dir=str(Path(out_dir) / "run"), tp=tp)
    config.workload.duration_s, config.workload.rate_per_s = duration_s, rate_per_s
    config.workload.seed = seed
    config.cores = [r % (os.cpu_count() or 1) for r in range(tp)]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        config.master_port = probe.getsockname()[1]
    return launch(config.write(Path(config.run_dir) / "serve.json"))


def stop_ranks(ranks: list[subprocess.Popen]) -> None:
    for process in ranks:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for process in ranks:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1]))
