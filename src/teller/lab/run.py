"""`teller lab run`: record one labelled case, the workload served under one real fault.

A case directory holds what `teller.collect` writes (traces/rank{R}.pt.trace.json.gz, logs/,
manifest.json), the engine's own ground truth (ground_truth/steps.jsonl, requests.jsonl), the run
configuration (run/serve.json, t0_ns, pids) and labels.json (`teller.labels.CaseLabels`).

The fault window `A:B` is in **seconds after serve start** (t0: the moment rank 0 finishes warm-up,
before the first request arrives); OS faults are applied and reverted by a thread here at those
times, in-process faults switch themselves on the same clock. The labels carry the window in unix
ns and the step ordinals of the guilty rank it covers, found by reading the recorded traces back
with `build_tree`; where the fault's counter tells step by step when it acted, only the window
steps it acted on (`teller.lab.acted`).

As root each rank gets its own network namespace and cgroup; without root ranks share loopback and
faults that need root are refused. The case is written to a temporary sibling folder and renamed
into place only when complete; namespaces, links, cgroups and helper processes are removed on
success, error, Ctrl-C or SIGTERM, and by the run's guard process (`teller.lab.guard`) when the run
is killed outright (SIGKILL); the launcher and the ranks die with their parent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from teller.errors import TellerError
from teller.faults import FAULTS
from teller.lab import netns
from teller.lab.acted import (
    STEPS_FILE,
    FaultCounter,
    fault_counter,
    steps_acted_on,
    steps_held_back,
)
from teller.lab.cgroups import cgroup_version, rank_cgroups
from teller.lab.faults.catalog import LAB_FAULTS, explanation
from teller.lab.guard import PARENT_PID_ENV, guarded
from teller.lab.inject import FaultInjector, FaultPlan
from teller.lab.netns import LabNetwork
from teller.lab.serve.config import InProcessFault, ServeConfig
from teller.labels import CaseLabels
from teller.layout import GROUND_TRUTH_DIR

#: cpu.shares of each rank's cgroup (v1 default 1024): ranks in their own groups are outside the
#: kernel's session autogroups, and this weight keeps unrelated load on a shared machine from
#: disturbing them much; contention injected into a rank's own group still hits it fully.
RANK_CPU_SHARES = 8192


@dataclass
class CaseSpec:
    """One case: which fault, where, how hard, when; and the workload it runs on."""

    fault: str = "none"
    rank: int = 0
    intensity: float = 0.5
    window_s: tuple[float, float] = (3.0, 7.0)
    tp: int = 2
    seed: int = 0
    duration_s: float = 10.0
    rate_per_s: float = 6.0

    @property
    def plan(self) -> FaultPlan:
        return FaultPlan(self.fault, self.rank, self.intensity, self.window_s)

    def validate(self) -> None:
        if self.fault not in LAB_FAULTS:
            raise TellerError(f"unknown lab fault {self.fault!r}; known: {', '.join(LAB_FAULTS)}")
        if not 0 <= self.rank < self.tp:
            raise TellerError(f"--rank {self.rank} is not a rank of --tp {self.tp}")
        start, end = self.window_s
        if not 0 <= start < end:
            raise TellerError(f"--window {start}:{end}: need 0 <= A < B (seconds after start)")
        if self.tp < 1:
            raise TellerError(f"--tp {self.tp}: need at least one rank")
        if LAB_FAULTS[self.fault].needs_root and not netns.is_root():
            netns.require_root(f"fault {self.fault}")


@dataclass
class CaseResult:
    case_dir: Path
    labels: CaseLabels
    serve_s: float  # wall time of the serving run


def parse_window(text: str) -> tuple[float, float]:
    try:
        start, end = (float(part) for part in text.split(":"))
    except ValueError:
        raise TellerError(f"--window {text!r}: expected A:B in seconds, e.g. 3:7") from None
    return start, end


def _sweep_own(tag: str) -> None:
    """Sweep this run's own tag after its clean-up: a rank still exiting when its group was
    removed leaves the group behind, and the guard stands down once the run says it is done."""
    from teller.lab.guard import sweep_until_clean

    for item in sweep_until_clean(tag, deadline_s=10.0):
        print(f"teller lab: could not remove {item}", file=sys.stderr)


def run_case(spec: CaseSpec, out: str | Path) -> CaseResult:
    """Record one case into `out` (which must not exist yet) and label it."""
    from teller.collect import collect  # local: the collector is only needed to record

    spec.validate()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise TellerError(f"{out}: already exists and is not empty; choose a new --out")
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    failed = out.parent / f"{out.name}.failed"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if netns.is_root():  # what a killed run left (namespaces, links, cgroups) goes first
        from teller.lab.sweep import sweep

        sweep()
    tag = f"tl{os.getpid() % 100000}"
    try:
        with (
            guarded(tag, partial, failed),
            _interrupt_on_sigterm(),
            contextlib.ExitStack() as stack,
        ):
            if netns.is_root():  # runs last: whatever the steps below could not remove
                stack.callback(_sweep_own, tag)
            network = (
                stack.enter_context(netns.lab_network(spec.tp, tag)) if netns.is_root() else None
            )
            groups = None
            if netns.is_root() and cgroup_version():
                groups = stack.enter_context(rank_cgroups(spec.tp, tag))
            config = _serve_config(spec, partial / "run", network)
            if groups is not None:
                config.cgroup_procs = [group.procs_files() for group in groups]
                for group in groups:
                    group.set_cpu_weight(RANK_CPU_SHARES)
            config_path = config.write(partial / "run" / "serve.json")
            injector = FaultInjector(spec.plan, config, network, groups)
            stack.callback(injector.stop)
            injector.start()
            began = time.monotonic()
            result = collect(
                [sys.executable, "-m", "teller.lab.serve.launch", str(config_path)],
                partial,
                steps=(0, 10**9),
                env={PARENT_PID_ENV: str(os.getpid())},
            )
            serve_s = time.monotonic() - began
            injector.stop()
            if injector.error is not None:
                raise TellerError(f"fault {spec.fault} could not be applied: {injector.error}")
            if result.exit_code != 0:
                raise TellerError(
                    f"serving run failed with exit status {result.exit_code}; "
                    f"see {out}.failed/logs: {_log_tail(partial)}"
                )
            counter = fault_counter(partial, spec.fault, spec.rank)
            labels = _labels(spec, partial, out.name, injector, counter)
            _check_fault_acted(spec, counter, labels, kept_at=failed)
        labels.write(partial)
        if out.exists():
            out.rmdir()
        os.replace(partial, out)
        return CaseResult(out, labels, serve_s)
    except BaseException:
        shutil.rmtree(failed, ignore_errors=True)
        if partial.exists():
            os.replace(partial, failed)
        raise


def _serve_config(spec: CaseSpec, run_dir: Path, network: LabNetwork | None) -> ServeConfig:
    config = ServeConfig(run_dir=str(run_dir), tp=spec.tp)
    config.workload.seed = spec.seed
    config.workload.duration_s = spec.duration_s
    config.workload.rate_per_s = spec.rate_per_s
    config.cores = [r % (os.cpu_count() or 1) for r in range(spec.tp)]
    start, end = spec.window_s
    kind = LAB_FAULTS[spec.fault]
    if kind.mechanism == "process":
        config.fault = InProcessFault(spec.fault, spec.rank, start, end, spec.intensity)
    if spec.fault == "workload_shift":
        config.workload.burst_start_s, config.workload.burst_end_s = start, end
        config.workload.burst_rate_per_s = 1.0 + 3.0 * spec.intensity
        config.workload.burst_prompt_tokens = int(192 + 320 * spec.intensity)
    if network is not None:
        config.netns, config.ifnames = network.namespaces, network.rank_links
        config.master_addr, config.master_port = network.addresses[0], 29500
    else:
        config.master_port = _free_port()
    return config


def _labels(
    spec: CaseSpec,
    case_dir: Path,
    case_id: str,
    injector: FaultInjector,
    counter: FaultCounter | None,
) -> CaseLabels:
    from teller.callchain.tree import build_tree
    from teller.ingest import read_run

    t0_ns = int((case_dir / "run" / "t0_ns").read_text())
    kind = LAB_FAULTS[spec.fault]
    start_s, end_s = spec.window_s
    if kind.mechanism == "os":
        window = (injector.applied_ns, injector.reverted_ns)
        if window[0] is None or window[1] is None:
            raise TellerError(
                f"the run ended before the fault window opened ({start_s}:{end_s} s); "
                "use an earlier window or a longer --duration"
            )
    else:
        window = (t0_ns + int(start_s * 1e9), t0_ns + int(end_s * 1e9))
    tree = build_tree(read_run([case_dir / "traces"]))
    steps = tree.steps
    step_rank = spec.rank if spec.fault != "scheduler_misconfig" else 0
    end_ns = steps.start_ns + steps.dur_ns
    on_rank = steps.rank == step_rank
    covered = on_rank & (steps.start_ns < window[1]) & (end_ns > window[0])
    labelled, steps_from = covered, "window"
    if counter is not None and kind.marks_steps:
        acted = np.zeros(len(covered), dtype=bool)
        acted[on_rank] = steps_acted_on(steps.start_ns[on_rank], end_ns[on_rank], counter)
        labelled, steps_from = covered & acted, counter.name
    if spec.fault == "scheduler_misconfig" and (held := steps_held_back(case_dir)) is not None:
        labelled, steps_from = covered & np.isin(steps.index, held), "held_back"
    view = FAULTS[spec.fault]
    is_fault = view != "-"
    return CaseLabels(
        case_id=case_id,
        source="lab",
        fault=spec.fault,
        view=view,
        guilty_rank=(step_rank if is_fault else None),
        guilty_operator=kind.guilty_operator,
        window_ns=window if spec.fault != "none" else None,
        steps=steps.index[labelled].tolist() if spec.fault != "none" else [],
        intensity=spec.intensity,
        seed=spec.seed,
        explanation=explanation(spec.fault, spec.rank, spec.intensity),
        params={
            "tp": spec.tp,
            "window_s": list(spec.window_s),
            "duration_s": spec.duration_s,
            "rate_per_s": spec.rate_per_s,
            "t0_ns": t0_ns,
            "netns": netns.is_root(),
            "requested_rank": spec.rank,
            "window_steps": int(covered.sum()) if spec.fault != "none" else 0,
            "steps_from": steps_from,
        },
    )


def _check_fault_acted(
    spec: CaseSpec, counter: FaultCounter | None, labels: CaseLabels, kept_at: Path
) -> None:
    """Refuse a recording whose fault left no trace in the counter it must raise on the guilty
    rank (`FaultKind.shows_in`): a memory limit above what the rank uses, a CPU quota above
    what it asks for, or a rate limit whose bucket holds every transfer changes nothing, and
    labelling its window would teach and score a fault that never acted; so does a capped
    scheduler whose limits kept nothing waiting in any window step. Where the counter was
    not sampled or not readable there is nothing to check against, and the recording stands.
    The error names the counter's file where the refused recording is kept (`kept_at`)."""
    window_ns = labels.window_ns
    if (
        labels.params.get("steps_from") == "held_back"
        and window_ns is not None
        and not labels.steps
    ):
        start_s, end_s = spec.window_s
        raise TellerError(
            f"{spec.fault} did not act: in no step of the window {start_s}:{end_s} s did its "
            f"lowered limits keep out work the configured ones would have run "
            f"({kept_at / GROUND_TRUTH_DIR / STEPS_FILE}); nothing waited for them, so the case "
            "is not labelled; try a higher --rate or --intensity"
        )
    if counter is None or window_ns is None:
        return
    if LAB_FAULTS[spec.fault].marks_steps:
        acted = bool(labels.steps)
    else:
        inside = (counter.t_ns >= window_ns[0]) & (counter.t_ns <= window_ns[1])
        values = counter.values[inside]
        acted = len(values) < 2 or values[-1] > values[0]
    if not acted:
        start_s, end_s = spec.window_s
        where = kept_at / counter.source
        raise TellerError(
            f"{spec.fault} on rank {spec.rank} did not act: its {counter.name} did not rise in "
            f"any step of the window {start_s}:{end_s} s ({where}); at --intensity "
            f"{spec.intensity} the fault changed nothing, so the case is not labelled; try a "
            "higher --intensity"
        )


def _log_tail(case_dir: Path, lines: int = 3) -> str:
    log = case_dir / "logs" / "launcher.log"
    if not log.exists():
        return "(no launcher log)"
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    return " | ".join(line[28:] for line in tail)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: Signals that end a run through its clean-up (SIGINT already raises KeyboardInterrupt).
INTERRUPTS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP (a closed terminal) into KeyboardInterrupt so every `finally`
    clean-up runs: their default actions would leave namespaces, cgroups and helpers behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, interrupt) for number in INTERRUPTS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
