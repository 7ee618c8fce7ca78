"""Start the ranks of one serving run and wait for them: `python -m teller.lab.serve.launch CFG`.

This is the command the collector runs for `teller lab run` and the body of `teller lab serve`.
Each rank is its own process (in its own network namespace and pinned to its own core when the
config says so). If one rank fails or the launcher is interrupted, the others are stopped too, so
no rank is left waiting at a collective; if the launcher is killed outright, the ranks die with it
(`teller.lab.guard.die_with_parent`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from teller.collect.inject._teller_collect_agent import ENV_DIR as COLLECTOR_DIR_ENV
from teller.errors import TellerError
from teller.lab.guard import PARENT_PID_ENV, die_with_expected_parent
from teller.lab.serve.config import InProcessFault, ServeConfig

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
    env[PARENT_PID_ENV] = str(os.getpid())  # the rank dies with this launcher
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


@dataclass
class ServeFault:
    """A fault switched on inside a window of serve seconds while the engine serves normally."""

    name: str
    rank: int = 0
    intensity: float = 0.5
    window_s: tuple[float, float] = (20.0, 1e9)


def serve(
    out_dir: str | Path,
    tp: int = 2,
    duration_s: float = 10.0,
    rate_per_s: float = 6.0,
    seed: int = 0,
    port: int | None = None,
    host: str = "127.0.0.1",
    profile_dir: str | Path | None = None,
    fault: ServeFault | None = None,
) -> int:
    """`teller lab serve`: run the workload standalone on loopback, without the collector.

    Ranks log to stdout; the ground truth lands in `out_dir/ground_truth/`. With `port`, rank 0
    serves `/metrics` and the profiler endpoints there (0: a free port, written to
    `out_dir/run/http_port`), each capture's rank traces going to `profile_dir` (default
    `out_dir/profiles`; no profiler endpoints under `teller collect`, whose profiler already
    records everything). `fault` is applied by the OS (straggler, cpu_contention) or by the ranks
    themselves (host_stall, slow_operator, scheduler_misconfig), as `teller lab run` applies it.
    """
    config = ServeConfig(run_dir=str(Path(out_dir) / "run"), tp=tp)
    config.workload.duration_s, config.workload.rate_per_s = duration_s, rate_per_s
    config.workload.seed = seed
    config.cores = [r % (os.cpu_count() or 1) for r in range(tp)]
    config.master_port = _free_port("127.0.0.1", 0)
    if port is not None:
        _free_port(host, port)  # refuse a taken port here, not as a traceback in rank 0
        while config.master_port == port:  # the rendezvous must not take the endpoints' port
            config.master_port = _free_port("127.0.0.1", 0)
        config.http_host, config.http_port = host, port
        if not os.environ.get(COLLECTOR_DIR_ENV):  # under `teller collect` the collector profiles
            config.profile_dir = str(Path(profile_dir or Path(out_dir) / "profiles").resolve())
    with contextlib.ExitStack() as stack:
        injector = _fault_injector(fault, config, stack) if fault is not None else None
        config_path = config.write(Path(config.run_dir) / "serve.json")
        if injector is None:
            return launch(config_path)
        injector.start()
        stack.callback(injector.stop)
        status = launch(config_path)
        injector.stop()
        if injector.error is not None:
            raise TellerError(f"fault {fault.name} could not be applied: {injector.error}")
        return status


def _fault_injector(fault: ServeFault, config: ServeConfig, stack: contextlib.ExitStack):
    """Configure an in-process fault, or return the thread that applies an OS one on time.

    As root each rank gets its own cgroup first, so a straggler is a CPU quota, as in
    `teller lab run`'s cases, rather than the stop/continue duty cycle used without one."""
    from teller.lab import netns
    from teller.lab.cgroups import cgroup_version, rank_cgroups
    from teller.lab.faults.catalog import LAB_FAULTS
    from teller.lab.guard import guarded
    from teller.lab.inject import FaultInjector
    from teller.lab.run import RANK_CPU_SHARES, CaseSpec

    spec = CaseSpec(fault.name, fault.rank, fault.intensity, fault.window_s, config.tp)
    spec.validate()
    kind = LAB_FAULTS[fault.name]
    if kind.mechanism == "process":
        start_s, end_s = fault.window_s
        config.fault = InProcessFault(fault.name, fault.rank, start_s, end_s, fault.intensity)
        return None
    if kind.mechanism != "os" or kind.needs_root:
        raise TellerError(
            f"fault {fault.name} needs `teller lab run` (network namespaces, cgroups or a "
            "changed workload); `teller lab serve` switches straggler, cpu_contention, "
            "host_stall, slow_operator and scheduler_misconfig"
        )
    groups = None
    if netns.is_root() and cgroup_version():
        tag = f"tl{os.getpid() % 100000}"
        stack.enter_context(guarded(tag))  # a killed server leaves no rank cgroup behind
        groups = stack.enter_context(rank_cgroups(config.tp, tag))
        config.cgroup_procs = [group.procs_files() for group in groups]
        for group in groups:
            group.set_cpu_weight(RANK_CPU_SHARES)
    return FaultInjector(spec.plan, config, None, groups)


def _free_port(host: str, port: int) -> int:
    """`port` if nothing listens there (0: any free one); a clear error otherwise."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            raise TellerError(
                f"cannot listen on {host}:{port}: {error.strerror}; choose another --port"
            ) from None
        return probe.getsockname()[1]


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
    die_with_expected_parent()  # under `teller lab run`: a killed run takes its launcher along
    sys.exit(launch(sys.argv[1]))
