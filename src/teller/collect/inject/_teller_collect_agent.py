"""The collector's agent: runs inside every Python process of the target, started by `sitecustomize`.

Stand-alone on purpose (standard library plus the target's own torch; no `teller` import), because
the target may run in an interpreter where teller is not installed. It does nothing until the
process imports torch; then, in that process only, it

* starts `torch.profiler` (CPU, plus CUDA when `torch.cuda.is_available()`, shapes recorded,
  Python stacks only with TELLER_COLLECT_WITH_STACK=1) and reads the clocks (`time.time_ns`,
  `monotonic_ns`, `perf_counter_ns`) at that moment;
* with `TELLER_COLLECT_STEPS=A:B`, instead warms the profiler up at import, counts the target's own
  step annotations, and records only steps A..B (see `StepWindow`);
* copies the process's stdout/stderr, line by line with timestamps, to `logs/<name>.log` through a
  small helper process (`_teller_collect_tee.py`) that outlives a crash of the target;
* exports the trace to `traces/<name>.pt.trace.json.gz` (temp file, then rename) at normal exit,
  on an uncaught exception, on SIGTERM/SIGINT/SIGHUP (chaining to the handlers that were there),
  or right after step B (then on a thread, so the target's next step does not wait for it);
* records what it did in `procs/<pid>.json` (written atomically), which the runner merges into
  `manifest.json`.

`<name>` is `rank{RANK}`, else `rank{LOCAL_RANK}`, else `rank{R}` once the process calls
`torch.distributed.init_process_group` (the trace and log are renamed then), else `rankpid{PID}`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gzip
import importlib.abc
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

ENV_DIR = "TELLER_COLLECT_DIR"
ENV_STEPS = "TELLER_COLLECT_STEPS"
#: "torch" (default); "nvtx" (under nsys: NVTX ranges for ops and annotations, no Kineto);
#: "off" (logs and records only).
ENV_PROFILE = "TELLER_COLLECT_PROFILE"
ENV_WITH_STACK = "TELLER_COLLECT_WITH_STACK"
#: "0" turns input shapes off: most of the per-operator cost, but batch facts come from shapes.
ENV_RECORD_SHAPES = "TELLER_COLLECT_RECORD_SHAPES"
ENV_STEP_REGEX = "TELLER_COLLECT_STEP_REGEX"

#: Step annotations the agent counts: the same shapes teller.callchain.steps recognises.
STEP_NAME = re.compile(
    r"^(?:ProfilerStep#\d+$"
    r"|execute_(?:\d+_)?context_\d+\([^)]*\)_generation_\d+\("
    r"|step\[)"
)
_STEP_PREFIXES = ("ProfilerStep#", "execute_", "step[")
_TEE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_teller_collect_tee.py")
_GZIP_LEVEL = 3  # traces are large and export sits on the target's exit path: favour speed


def _write_json_atomic(path: str, value: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as handle:
        json.dump(value, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _clock_readings() -> dict[str, int]:
    return {
        "time_ns": time.time_ns(),
        "monotonic_ns": time.monotonic_ns(),
        "perf_counter_ns": time.perf_counter_ns(),
    }


class StepWindow:
    """Profile only steps A..B (inclusive), counted 0-based per process.

    A step is a `record_function` range whose name is a step annotation (`ProfilerStep#N`, vLLM's
    `execute_…context_N(…)_generation_M(…)`, SGLang's `step[…]`, or TELLER_COLLECT_STEP_REGEX).
    Steps are numbered in the order the process enters them; a step annotation opened while another
    is open belongs to it and is not counted. The profiler starts just before step A's range opens
    and stops (and exports) just after step B's range closes, so the trace holds exactly those steps.
    """

    def __init__(self, first: int, last: int, pattern: re.Pattern[str]) -> None:
        self.first, self.last = first, last
        self.pattern = pattern
        self.seen = 0
        self.open_step: object | None = None
        self._is_step: dict[str, bool] = {}

    def is_step(self, name: str) -> bool:
        if self.pattern is STEP_NAME and not name.startswith(_STEP_PREFIXES):
            return False  # the common case, decided without a dictionary or regex
        known = self._is_step.get(name)
        if known is None:
            known = bool(self.pattern.search(name))
            if len(self._is_step) < 10_000:  # vLLM names vary per step; keep the cache bounded
                self._is_step[name] = known
        return known


class Agent:
    """Per-process collection state; one instance, created when torch finishes importing."""

    def __init__(self, out_dir: str, torch) -> None:
        self.out_dir = out_dir
        self.torch = torch
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.rank, self.rank_source = self._rank_from_env()
        self.world_size = int(os.environ.get("WORLD_SIZE", "0") or 0)
        self.name = self._name()
        self.profiler = None
        self.profiling = False
        self.clock: dict[str, int] | None = None
        self.trace_path: str | None = None
        self.trace_note = ""
        self.log_path: str | None = None
        self.steps_profiled: list[int] = []
        self.finished = False
        self.lock = threading.RLock()
        self.with_stack = os.environ.get(ENV_WITH_STACK, "") == "1"
        self.record_shapes = os.environ.get(ENV_RECORD_SHAPES, "1") != "0"
        self.profile_mode = os.environ.get(ENV_PROFILE, "torch")
        self.profile_enabled = self.profile_mode == "torch"
        self.window = self._window()
        self.started_ns = time.time_ns()
        self.exit_reason = ""
        self.signal_seen = ""
        self.writer: threading.Thread | None = None

    # -- identity ------------------------------------------------------------------------------
    @staticmethod
    def _rank_from_env() -> tuple[int | None, str]:
        for variable in ("RANK", "LOCAL_RANK"):
            value = os.environ.get(variable, "")
            if value.isdigit():
                return int(value), variable
        return None, ""

    def _name(self) -> str:
        """`rank{R}` if no other process of this run holds it, else `rank{R}.pid{PID}`.

        A child that inherits RANK (a spawned data-loader worker, a helper) must not overwrite its
        parent's trace; its own file still reads as rank R, beside the parent's.
        """
        if self.rank is None:
            return f"rankpid{self.pid}"
        name = f"rank{self.rank}"
        procs = os.path.join(self.out_dir, "procs")
        os.makedirs(procs, exist_ok=True)
        try:
            os.close(os.open(os.path.join(procs, f"{name}.claim"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return f"{name}.pid{self.pid}"
        return name

    def _window(self) -> StepWindow | None:
        spec = os.environ.get(ENV_STEPS, "")
        if not spec:
            return None
        first, last = (int(part) for part in spec.split(":"))
        custom = os.environ.get(ENV_STEP_REGEX)
        return StepWindow(first, last, re.compile(custom) if custom else STEP_NAME)

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._start_log_capture()
        self._watch_distributed_init()
        self._install_exit_hooks()
        if self.profile_mode == "nvtx":
            self._emit_nvtx()
        if self.profile_enabled and _is_torch_launcher(sys.argv):
            self.profile_enabled = False
            self.trace_note = "torchrun launcher: logged, not profiled (it runs no operator)"
        if self.profile_enabled:
            self._prepare_profiler()
            if self.window is None:
                self._begin_profiling()
            else:
                self._watch_steps()
        self._write_record()

    def _start_log_capture(self) -> None:
        """Route fds 1 and 2 through the tee helper; the helper forwards to where they went before."""
        logs = os.path.join(self.out_dir, "logs")
        os.makedirs(logs, exist_ok=True)
        self.log_path = os.path.join(logs, f"{self.name}.log")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
        try:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            console_out, console_err = os.dup(1), os.dup(2)
        except OSError as error:
            self.log_path = None
            self.trace_note = f"log capture off: {error}"
            return
        try:
            subprocess.Popen(
                [
                    sys.executable,
                    "-S",
                    "-E",
                    _TEE_SCRIPT,
                    self.log_path,
                    f"{out_r}:1",
                    f"{err_r}:2",
                ],
                stdin=subprocess.DEVNULL,
                stdout=console_out,
                stderr=console_err,
                pass_fds=(out_r, err_r),
                close_fds=True,
            )
        except OSError as error:
            for fd in (out_r, out_w, err_r, err_w, console_out, console_err):
                os.close(fd)
            self.log_path = None
            self.trace_note = f"log capture off: {error}"
            return
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (out_r, out_w, err_r, err_w, console_out, console_err):
            os.close(fd)

    def _watch_distributed_init(self) -> None:
        """Learn the global rank from init_process_group (torch.multiprocessing.spawn sets no RANK)."""
        distributed = getattr(self.torch, "distributed", None)
        if distributed is None or not distributed.is_available():
            return
        c10d = distributed.distributed_c10d
        original = c10d.init_process_group

        @functools.wraps(original)
        def init_process_group(*args, **kwargs):
            result = original(*args, **kwargs)
            with self.lock:
                self._learn_rank()
                self._rename_to_rank()
            return result

        c10d.init_process_group = init_process_group
        distributed.init_process_group = init_process_group

    def _learn_rank(self) -> None:
        try:
            distributed = self.torch.distributed
            if not distributed.is_initialized():
                return
            rank, world = distributed.get_rank(), distributed.get_world_size()
        except Exception:  # an agent must never break the target
            return
        self.world_size = world
        if self.rank is None or self.rank_source == "LOCAL_RANK":
            self.rank, self.rank_source = rank, "init_process_group"

    def _install_exit_hooks(self) -> None:
        atexit.register(self.finish, "exit")
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget_in_child)
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            try:
                previous = signal.getsignal(number)
                signal.signal(number, functools.partial(self._on_signal, previous))
            except (OSError, ValueError):
                pass

    def _forget_in_child(self) -> None:
        """A forked child shares our state but not the profiler's threads: it must not export."""
        self.finished = True

    def _on_signal(self, previous, number: int, frame) -> None:
        """Chain to what was there. A Python handler (KeyboardInterrupt, a graceful shutdown)
        decides whether the process ends, and atexit exports if it does; the default action would
        kill the process without atexit, so export first, then let the default action happen."""
        name = signal.Signals(number).name
        if callable(previous):
            self.signal_seen = name
            previous(number, frame)
            return
        if previous == signal.SIG_IGN:
            return
        self.finish(name)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)

    # -- profiler --------------------------------------------------------------------------------
    def _prepare_profiler(self) -> None:
        """Build and warm up the profiler now: Kineto's first set-up takes seconds on a CPU host,
        and paying it at import keeps it out of the steps (with --steps, out of step A)."""
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._cuda_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(
            activities=activities, record_shapes=self.record_shapes, with_stack=self.with_stack
        )
        self.profiler.prepare_trace()

    def _emit_nvtx(self) -> None:
        """Under Nsight Systems: every operator and record_function range becomes an NVTX range
        (with shapes), so the nsys report holds the steps and operators Kineto would have had."""
        try:
            self.nvtx = self.torch.autograd.profiler.emit_nvtx(record_shapes=self.record_shapes)
            self.nvtx.__enter__()  # left open: the ranges run until the process ends
        except Exception as error:  # e.g. a CPU-only torch build has no NVTX
            self.trace_note = f"NVTX ranges off: {type(error).__name__}: {error}"

    def _begin_profiling(self) -> None:
        self.clock = _clock_readings()
        self.profiler.start_trace()
        self.profiling = True

    def _cuda_available(self) -> bool:
        """Ask without creating a CUDA context, so the target can still fork CUDA-free children."""
        previous = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        try:
            return bool(self.torch.cuda.is_available())
        except Exception:
            return False
        finally:
            if previous is None:
                os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
            else:
                os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = previous

    def _watch_steps(self) -> None:
        """Wrap record_function's enter/exit to count step annotations (the target is untouched)."""
        record_function = self.torch.autograd.profiler.record_function
        original_enter, original_exit = record_function.__enter__, record_function.__exit__
        window = self.window
        agent = self

        def __enter__(range_self):
            name = getattr(range_self, "name", "")
            if window.open_step is None and not agent.finished and window.is_step(name):
                index = window.seen
                window.seen += 1
                window.open_step = range_self
                range_self._teller_step = index
                if index == window.first and not agent.profiling:
                    agent._begin_profiling()
                if agent.profiling:
                    agent.steps_profiled.append(index)
            return original_enter(range_self)

        def __exit__(range_self, *exc_info):
            result = original_exit(range_self, *exc_info)
            if window.open_step is range_self:
                window.open_step = None
                if getattr(range_self, "_teller_step", -1) >= window.last and agent.profiling:
                    agent.finish(f"step {window.last} done", background=True)
            return result

        record_function.__enter__ = __enter__
        record_function.__exit__ = __exit__

    # -- finish ----------------------------------------------------------------------------------
    def finish(self, reason: str, background: bool = False) -> None:
        """Stop, export, rename, record. Idempotent; safe from atexit and signal handlers.

        `background` (the end of a --steps window, mid-run) writes the trace on a thread so the
        target's next step does not wait for it; the thread is not a daemon, so the interpreter
        waits for it at exit, and a later finish (a signal) joins it before the process dies.
        """
        if os.getpid() != self.pid:
            return
        with self.lock:
            if self.finished:
                writer = self.writer
                if writer is not None and writer is not threading.current_thread():
                    writer.join()
                return
            self.finished = True
            self.exit_reason = f"{reason} after {self.signal_seen}" if self.signal_seen else reason
            try:
                self._learn_rank()
                self._rename_to_rank()
                if self.profiling:
                    self._stop()
                    if background:
                        self.writer = threading.Thread(
                            target=self._write_trace_and_record, name="teller-collect-export"
                        )
                        self.writer.start()
                        return
                    self._write_trace()
                elif self.window is not None and self.profile_enabled:
                    self.trace_note = (
                        f"no trace: the process saw {self.window.seen} steps, "
                        f"window {self.window.first}:{self.window.last} never began"
                    )
            except Exception as error:  # report, never raise into the target's exit path
                self.trace_note = f"export failed: {type(error).__name__}: {error}"
            self._write_record()

    def _write_trace_and_record(self) -> None:
        try:
            self._write_trace()
        except Exception as error:
            self.trace_note = f"export failed: {type(error).__name__}: {error}"
        self._write_record()

    def _rename_to_rank(self) -> None:
        """Once init_process_group told us the rank, the log (and the trace to come) take it."""
        if self.rank is None or not self.name.startswith("rankpid"):
            return
        name = self._name()
        if self.log_path:
            new_log = os.path.join(os.path.dirname(self.log_path), f"{name}.log")
            os.replace(self.log_path, new_log)  # the tee helper keeps writing to the same file
            self.log_path = new_log
        self.name = name

    def _stop(self) -> None:
        profiler = self.profiler
        metadata = getattr(profiler, "_trace_metadata", {})
        if self.rank is not None and "distributedInfo" not in metadata:
            info = {"rank": self.rank, "world_size": self.world_size, "source": self.rank_source}
            profiler.add_metadata_json("distributedInfo", json.dumps(info))
        profiler.add_metadata_json(
            "tellerCollect",
            json.dumps({"pid": self.pid, "host": self.host, "clock_at_start": self.clock}),
        )
        profiler.stop()
        self.profiling = False

    def _write_trace(self) -> None:
        profiler = self.profiler
        traces = os.path.join(self.out_dir, "traces")
        os.makedirs(traces, exist_ok=True)
        final = os.path.join(traces, f"{self.name}.pt.trace.json.gz")
        plain = os.path.join(traces, f".{self.name}.{self.pid}.json.tmp")
        packed = os.path.join(traces, f".{self.name}.{self.pid}.json.gz.tmp")
        try:
            profiler.export_chrome_trace(plain)
            if not _has_operator_events(plain):
                self.trace_note = "no trace written: the process ran no torch operator"
                return
            with open(plain, "rb") as source, gzip.open(packed, "wb", _GZIP_LEVEL) as target:
                shutil.copyfileobj(source, target, 1 << 20)
            os.replace(packed, final)
            self.trace_path = final
        finally:
            for leftover in (plain, packed):
                if os.path.exists(leftover):
                    os.unlink(leftover)

    def _write_record(self) -> None:
        procs = os.path.join(self.out_dir, "procs")
        os.makedirs(procs, exist_ok=True)
        record = {
            "pid": self.pid,
            "ppid": os.getppid(),
            "host": self.host,
            "argv": list(sys.argv),
            "name": self.name,
            "rank": self.rank,
            "rank_source": self.rank_source,
            "world_size": self.world_size,
            "trace": self.trace_path,
            "trace_note": self.trace_note,
            "log": self.log_path,
            "clock_at_profiler_start": self.clock,
            "steps": [self.window.first, self.window.last] if self.window else None,
            "steps_seen": self.window.seen if self.window else None,
            "steps_profiled": self.steps_profiled,
            "record_shapes": self.record_shapes,
            "with_stack": self.with_stack,
            "torch_imported_wall_ns": self.started_ns,
            "finished": self.finished,
            "exit_reason": self.exit_reason,
        }
        _write_json_atomic(os.path.join(procs, f"{self.pid}.json"), record)


#: Scripts that only start and watch ranks: profiling them costs Kineto's start-up and shows nothing.
_TORCH_LAUNCHERS = ("torchrun", "torch/distributed/run.py", "torch/distributed/launch.py")


_TORCH_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _is_torch_launcher(argv: list[str]) -> bool:
    """`torchrun ...` or `python -m torch.distributed.run ...` (where, while runpy imports the
    package, `sys.argv[0]` is still "-m": the interpreter's own `orig_argv` names the module)."""
    if argv and argv[0].replace(os.sep, "/").endswith(_TORCH_LAUNCHERS):
        return True
    original = list(getattr(sys, "orig_argv", []))  # Python 3.10+; the target's may be older
    return any(
        original[i] == "-m" and original[i + 1] in _TORCH_LAUNCHER_MODULES
        for i in range(len(original) - 1)
    )


def _has_operator_events(path: str) -> bool:
    """A launcher that imports torch but runs no op (torchrun) should not add a fake rank file."""
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            if b'"cpu_op"' in chunk or b'"user_annotation"' in chunk or b'"kernel"' in chunk:
                return True
    return False


class _TorchImportFinder(importlib.abc.MetaPathFinder):
    """Waits for `import torch`, lets the normal finders load it, then starts the agent."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # one shot, and no recursion into ourselves below
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original_exec = loader.exec_module
        out_dir = self.out_dir

        def exec_module(module):
            original_exec(module)
            del loader.exec_module  # back to the class's method
            _start_agent(out_dir, module)

        loader.exec_module = exec_module
        return spec


def _start_agent(out_dir: str, torch) -> None:
    try:
        Agent(out_dir, torch).start()
    except Exception as error:  # never break the target; say why on its stderr
        print(f"teller collect: agent not started in pid {os.getpid()}: {error}", file=sys.stderr)


def install() -> None:
    """Called by sitecustomize at interpreter start: cheap unless and until torch is imported."""
    out_dir = os.environ.get(ENV_DIR)
    if not out_dir:
        return
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure") and not stream.isatty():
            stream.reconfigure(line_buffering=True)  # lines reach the log when printed
    if "torch" in sys.modules:
        _start_agent(out_dir, sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchImportFinder(out_dir))
