"""Collection overhead: the same workload with and without `teller collect`, alternated.

Issue 3's overhead bench. A workload is any command that measures its own steps and writes them to
a JSON file it owns (`{"step_latency_ns": [...], "tokens_per_step": N}`); the path is substituted
for `{latency_file}` in its command line. The default is a tiny Llama (Hugging Face transformers,
random weights, 4 layers) decoding with a KV cache on the CPU, one `record_function` step
annotation per decode step as vLLM writes them. `--workload-cmd` plugs in another one, e.g. the
lab's server once it writes per-step latencies.

Configurations, run in alternating order (ABC, CBA, ABC, ...) so load drift hits all alike:

* `off`: the plain command;
* `on`: `teller collect -- CMD` (profiler on for the whole run, shapes recorded, logs teed);
* `noshapes` (with `--no-shapes`): `teller collect --no-shapes -- CMD` (no input shapes);
* `window` (with `--window A:B`): `teller collect --steps A:B` (profiler only for those steps;
  the rest of the run pays only the step counter and the log tee).

Reported per configuration: medians over runs of throughput (tokens/s over the measured steps) and
of each run's p50/p99 step latency, their ratios to `off`, and the median wall time of the whole
command (start-up and export included).

    .venv/bin/python bench/overhead.py [--pairs 5] [--steps 200] [--no-shapes] [--window 100:129]
    .venv/bin/python bench/overhead.py --workload-cmd "python my_server_bench.py --out {latency_file}"
    .venv/bin/python bench/overhead.py --per-op     # the profiler's own cost, in one process
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TELLER = [sys.executable, "-c", "import sys; from teller.cli import main; sys.exit(main())"]
TARGET_OVERHEAD = 0.05
CHILD_TIMEOUT_S = 900


# -- the built-in workload (runs in the child; imports torch and transformers only there) ---------
def tiny_llama(threads: int) -> tuple[object, object]:
    """The benchmark's model: a 4-layer Llama with random weights (seed 0), on `threads` threads."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=4096,
    )
    model = LlamaForCausalLM(config).eval()
    return model, config


def run_builtin_workload(
    latency_file: str, steps: int, warmup: int, batch: int, threads: int
) -> None:
    """Decode `warmup + steps` tokens for `batch` sequences with a KV cache; time each step.

    `threads` intra-op threads: on a small shared host, more threads than idle cores make
    OpenMP spin against other people's work and the noise swamps what is being measured.
    """
    import torch

    model, config = tiny_llama(threads)
    prompt = torch.randint(0, config.vocab_size, (batch, 32))
    latencies_ns: list[int] = []
    cpu_ns: list[int] = []
    with torch.inference_mode():
        output = model(prompt, use_cache=True)
        cache = output.cache
        token = output.logits[:, -1].argmax(-1, keepdim=True)
        for step in range(warmup + steps):
            name = f"execute_context_0(0)_generation_{batch}({batch})"
            begin_ns = time.perf_counter_ns()
            begin_cpu_ns = time.thread_time_ns()
            with torch.profiler.record_function(name):
                output = model(token, cache=cache, use_cache=True)
                cache = output.cache
                token = output.logits[:, -1].argmax(-1, keepdim=True)
            if step >= warmup:
                latencies_ns.append(time.perf_counter_ns() - begin_ns)
                cpu_ns.append(time.thread_time_ns() - begin_cpu_ns)
    Path(latency_file).write_text(
        json.dumps(
            {
                "step_latency_ns": latencies_ns,
                "step_cpu_ns": cpu_ns,
                "tokens_per_step": batch,
                "first_step": warmup,  # step-annotation index of the first measured step
            }
        )
    )


def per_op_cost(repeats: int = 5, ops: int = 20_000) -> str:
    """CPU µs per small operator without the profiler, with it, and with it minus shapes.

    The mechanism behind the step figures: Kineto records every operator in the calling thread,
    so its cost is per operator and a step pays it as many times as it runs operators. Minimum
    of `repeats` (thread CPU time, so other processes' load does not count), alternated.
    """
    import torch

    torch.set_num_threads(1)
    a = torch.randn(16, 16)

    def timed() -> float:
        begin = time.thread_time_ns()
        for _ in range(ops):
            torch.add(a, a)
        return (time.thread_time_ns() - begin) / ops / 1000

    best = {"off": [], "shapes": [], "no shapes": []}
    for _ in range(repeats):
        best["off"].append(timed())
        for label, shapes in (("shapes", True), ("no shapes", False)):
            profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes
            )
            profiler.start()
            best[label].append(timed())
            profiler.stop()
    off = min(best["off"])
    return (
        f"per operator (torch.add 16x16, thread CPU µs, min of {repeats}): off {off:.2f}, "
        f"profiled with shapes {min(best['shapes']):.2f} (+{min(best['shapes']) - off:.2f}), "
        f"without shapes {min(best['no shapes']):.2f} (+{min(best['no shapes']) - off:.2f})"
    )


def in_process_step_cost(repeats: int = 5, steps: int = 30, batch: int = 4) -> str:
    """CPU ms per decode step of the built-in model: profiler off, on with shapes, on without.

    All three alternate inside one process within seconds, so a busy host blurs them alike; the
    minimum over `repeats` of each block's median is reported. This isolates the profiler's own
    cost from everything else `teller collect` does (log tee, start-up, export).
    """
    import torch

    model, config = tiny_llama(1)

    def block() -> float:
        cpu_ns = []
        with torch.inference_mode():
            output = model(torch.randint(0, config.vocab_size, (batch, 32)), use_cache=True)
            cache, token = output.cache, output.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(steps):
                begin = time.thread_time_ns()
                output = model(token, cache=cache, use_cache=True)
                cache, token = output.cache, output.logits[:, -1].argmax(-1, keepdim=True)
                cpu_ns.append(time.thread_time_ns() - begin)
        return statistics.median(cpu_ns[5:]) / 1e6

    medians: dict[str, list[float]] = {"off": [], "shapes": [], "no shapes": []}
    for _ in range(repeats):
        medians["off"].append(block())
        for label, shapes in (("shapes", True), ("no shapes", False)):
            profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes
            )
            profiler.start()
            medians[label].append(block())
            profiler.stop()
    off = min(medians["off"])
    cells = [f"{label} {min(v):.2f} ({min(v) / off:.2f}x)" for label, v in medians.items()]
    return f"in-process CPU ms per decode step (min of {repeats} medians): " + ", ".join(cells)


# -- the driver ------------------------------------------------------------------------------------
@dataclass
class Run:
    config: str
    tokens_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_p50_ms: float  # median CPU time of the stepping thread per step
    wall_s: float
    in_window_ratio: float | None = None  # window runs: profiled steps / unprofiled neighbours


@dataclass
class Summary:
    runs: list[Run] = field(default_factory=list)

    def of(self, config: str) -> list[Run]:
        return [r for r in self.runs if r.config == config]

    def median(self, config: str, attribute: str) -> float:
        return statistics.median(getattr(r, attribute) for r in self.of(config))


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return float(ordered[index])


def one_run(config: str, workload: list[str], window: str | None, scratch: Path) -> Run:
    latency_file = scratch / f"latency-{config}-{time.monotonic_ns()}.json"
    command = [part.replace("{latency_file}", str(latency_file)) for part in workload]
    if config == "on":
        command = [
            *TELLER,
            "collect",
            "--out",
            str(latency_file.with_suffix(".collect")),
            "--",
            *command,
        ]
    elif config == "window":
        out = str(latency_file.with_suffix(".collect"))
        command = [*TELLER, "collect", "--out", out, "--steps", window, "--", *command]
    elif config == "noshapes":
        out = str(latency_file.with_suffix(".collect"))
        command = [*TELLER, "collect", "--out", out, "--no-shapes", "--", *command]
    begin = time.perf_counter()
    done = subprocess.run(command, capture_output=True, timeout=CHILD_TIMEOUT_S)
    wall_s = time.perf_counter() - begin
    if done.returncode != 0 or not latency_file.exists():
        sys.stderr.write(done.stderr.decode(errors="replace")[-3000:])
        raise SystemExit(f"{config} run failed with exit {done.returncode}")
    measured = json.loads(latency_file.read_text())
    latencies = measured["step_latency_ns"]
    tokens = measured.get("tokens_per_step", 1) * len(latencies)
    return Run(
        config=config,
        tokens_per_s=tokens / (sum(latencies) / 1e9),
        p50_ms=percentile(latencies, 0.50) / 1e6,
        p99_ms=percentile(latencies, 0.99) / 1e6,
        cpu_p50_ms=percentile(measured.get("step_cpu_ns") or [0], 0.50) / 1e6,
        wall_s=wall_s,
        in_window_ratio=in_window_ratio(latencies, measured.get("first_step"), window)
        if config == "window"
        else None,
    )


def in_window_ratio(latencies: list[int], first_step: int | None, window: str) -> float | None:
    """Median latency of the profiled steps over that of as many unprofiled steps on each side.

    Both sets run in the same process within a second or two of each other, so other people's load
    hits them alike: this is the cost of recording while it records, measured on a busy host. The
    steps next to the window (start and stop) are left out of both.
    """
    if first_step is None:
        return None
    first, last = (int(part) - first_step for part in window.split(":"))
    width = last - first + 1
    inside = latencies[first : last + 1]
    outside = latencies[max(0, first - 1 - width) : max(0, first - 1)]
    outside += latencies[last + 2 : last + 2 + width]
    if not inside or not outside:
        return None
    return statistics.median(inside) / statistics.median(outside)


def report(summary: Summary, configs: list[str]) -> str:
    """Medians and ratios; the verdict uses CPU time per step when the host is too busy for wall.

    On a shared host other people's work stretches wall-clock latency far more than the collector
    does; the spread of the `off` runs says how much. The CPU time the stepping thread spends per
    step (the profiler records in that thread) is what collection adds, load or not.
    """
    off_tps = [r.tokens_per_s for r in summary.of("off")]
    spread = (max(off_tps) - min(off_tps)) / statistics.median(off_tps)
    lines = [
        f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
        f"load {'/'.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"{len(off_tps)} runs per configuration; off-run throughput spread {spread:.0%}",
        "",
        "| config | tokens/s | ratio | p50 step ms | ratio | p99 step ms | ratio "
        "| CPU ms/step | ratio | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    attributes = ("tokens_per_s", "p50_ms", "p99_ms", "cpu_p50_ms")
    base = {a: summary.median("off", a) for a in attributes}
    for config in configs:
        cells = [config]
        for attribute in attributes:
            value = summary.median(config, attribute)
            shown = f"{value:,.0f}" if attribute == "tokens_per_s" else f"{value:.2f}"
            ratio = value / base[attribute] if base[attribute] else float("nan")
            cells += [shown, f"{ratio:.3f}"]
        cells.append(f"{summary.median(config, 'wall_s'):.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for config in configs[1:]:
        wall = base["tokens_per_s"] / summary.median(config, "tokens_per_s") - 1
        cpu = summary.median(config, "cpu_p50_ms") / base["cpu_p50_ms"] - 1
        verdict = "PASS" if cpu < TARGET_OVERHEAD else "MISS"
        trust = (
            ""
            if spread < TARGET_OVERHEAD
            else f" (off runs spread {spread:.0%}: wall time cannot judge a "
            f"{TARGET_OVERHEAD:.0%} target here)"
        )
        lines.append(
            f"{config}: CPU per step {cpu:+.1%} (target < {TARGET_OVERHEAD:.0%}) {verdict}; "
            f"time per token {wall:+.1%}{trust}"
        )
    ratios = [r.in_window_ratio for r in summary.of("window") if r.in_window_ratio]
    if ratios:
        lines.append(
            f"window: profiled steps take {statistics.median(ratios):.2f}x their unprofiled "
            f"neighbours in the same run (median of {len(ratios)} runs: "
            f"{', '.join(f'{x:.2f}' for x in ratios)})"
        )
    lines.append("")
    lines.append("per run (config tokens/s p50_ms p99_ms cpu_ms wall_s), in run order:")
    for run in summary.runs:
        lines.append(
            f"  {run.config:6s} {run.tokens_per_s:9.0f} {run.p50_ms:7.2f} {run.p99_ms:7.2f} "
            f"{run.cpu_p50_ms:7.2f} {run.wall_s:6.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="runs per configuration (>= 5)")
    parser.add_argument("--steps", type=int, default=200, help="measured decode steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured steps first")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="workload intra-op threads")
    parser.add_argument("--window", help="also run `collect --steps A:B` (e.g. 100:109)")
    parser.add_argument("--no-shapes", action="store_true", help="also run `collect --no-shapes`")
    parser.add_argument("--workload-cmd", help="command writing {latency_file} (replaces built-in)")
    parser.add_argument("--per-op", action="store_true", help="only the profiler's own cost")
    parser.add_argument("--workload", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.per_op:
        print(per_op_cost())
        print(in_process_step_cost())
        return 0
    if arguments.workload is not None:  # child mode: `overhead.py --workload FILE STEPS WARMUP B`
        latency_file, steps, warmup, batch, threads = arguments.workload
        run_builtin_workload(latency_file, int(steps), int(warmup), int(batch), int(threads))
        return 0
    if arguments.workload_cmd:
        workload = shlex.split(arguments.workload_cmd)
    else:
        workload = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--workload",
            "{latency_file}",
            str(arguments.steps),
            str(arguments.warmup),
            str(arguments.batch),
            str(arguments.threads),
        ]
    configs = ["off", "on"] + (["noshapes"] if arguments.no_shapes else [])
    configs += ["window"] if arguments.window else []
    summary = Summary()
    with tempfile.TemporaryDirectory(prefix="teller-overhead-") as scratch:
        for round_index in range(arguments.pairs):
            order = configs if round_index % 2 == 0 else configs[::-1]
            for config in order:
                run = one_run(config, workload, arguments.window, Path(scratch))
                summary.runs.append(run)
                print(
                    f"round {round_index} {config}: {run.tokens_per_s:,.0f} tok/s, "
                    f"p50 {run.p50_ms:.2f} ms, p99 {run.p99_ms:.2f} ms, "
                    f"CPU {run.cpu_p50_ms:.2f} ms/step, wall {run.wall_s:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    print("command: .venv/bin/python bench/overhead.py " + " ".join(sys.argv[1:]))
    print(report(summary, configs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
