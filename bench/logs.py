"""Log benchmark: teller's log reader on a 1M-line vLLM log against the bare-regex floor.

A log of real vLLM V1 line shapes (shared/formats/engine-logs.md: request
received/added/finished, periodic stats, iteration details, preemption, JIT warnings, uvicorn
access lines, an NCCL watchdog line, unknown lines for template mining, tracebacks) is generated
with varied ids and numbers into a temporary directory (never committed), then read by:

* the *floor*: one compiled regex (the vLLM header) matched against every decoded line, what any
  Python line parser pays at least;
* *teller*: `teller.ingest.logs.read_logs`, the whole path to the Arrow log table.

Each measurement runs in a fresh subprocess (peak RSS is that child's own, from `os.wait4`);
rounds are interleaved and medians reported, with CPU seconds beside wall seconds because the
machine is shared.

    .venv/bin/python bench/logs.py [--lines 1000000] [--repeats 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT_S = 900
#: Year of the generated log, passed to the reader so it does not fall back to the file's mtime.
LOG_YEAR = 2026


def generate(path: Path, lines: int, seed: int = 0) -> dict[str, int]:
    """Write `lines` lines of vLLM V1 shapes with varied ids and numbers; returns shape counts."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    second = 0
    written = 0
    open_requests: list[str] = []
    api, core, worker = rng.randint(1000, 99999), rng.randint(1000, 99999), rng.randint(1000, 99999)

    def stamp() -> str:
        day, rest = divmod(second, 86_400)
        hour, rest = divmod(rest, 3600)
        minute, sec = divmod(rest, 60)
        return f"{(day // 28) % 12 + 1:02d}-{day % 28 + 1:02d} {hour:02d}:{minute:02d}:{sec:02d}"

    with path.open("w", encoding="utf-8") as out:
        while written < lines:
            if rng.random() < 0.25:
                second += 1
            roll = rng.random()
            if roll < 0.22 or not open_requests:
                api_id = f"chatcmpl-{rng.getrandbits(64):016x}"
                engine_id = f"{api_id}-{rng.getrandbits(32):08x}"
                text = [
                    f"(APIServer pid={api}) INFO {stamp()} [logger.py:49] Received request {api_id}: "
                    f"params: SamplingParams(n=1, temperature={rng.random():.2f}, "
                    f"max_tokens={rng.randint(16, 2048)}), lora_request: None.",
                    f"(APIServer pid={api}) INFO {stamp()} [async_llm.py:382] Added request {engine_id}.",
                ]
                open_requests.append(engine_id)
                kind = "request_received+added"
            elif roll < 0.42:
                engine_id = open_requests.pop(rng.randrange(len(open_requests)))
                text = [
                    f"(APIServer pid={api}) INFO {stamp()} [async_llm.py:440] Finished request {engine_id}."
                ]
                kind = "request_finished"
            elif roll < 0.62:
                text = [
                    f'INFO:     172.18.0.{rng.randint(1, 254)}:{rng.randint(1024, 65535)} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
                ]
                kind = "http_access"
            elif roll < 0.80:
                text = [
                    f"(APIServer pid={api}) INFO {stamp()} [loggers.py:257] Engine 000: "
                    f"Avg prompt throughput: {rng.uniform(0, 5000):.1f} tokens/s, "
                    f"Avg generation throughput: {rng.uniform(0, 900):.1f} tokens/s, "
                    f"Running: {rng.randint(0, 256)} reqs, Waiting: {rng.randint(0, 64)} reqs, "
                    f"GPU KV cache usage: {rng.uniform(0, 100):.1f}%, "
                    f"Prefix cache hit rate: {rng.uniform(0, 100):.1f}%"
                ]
                kind = "stats"
            elif roll < 0.95:
                context = rng.randint(0, 8)
                text = [
                    f"(EngineCore_0 pid={core}) INFO {stamp()} [loggers.py:257] Engine 000: "
                    f"Iteration({written}): {context} context requests, {context * rng.randint(0, 2048)} "
                    f"context tokens, {rng.randint(0, 256)} generation requests, "
                    f"{rng.randint(0, 256)} generation tokens, iteration elapsed time: "
                    f"{rng.uniform(5, 400):.2f} ms, GPU KV cache usage: {rng.uniform(0, 100):.1f}%"
                ]
                kind = "iteration"
            elif roll < 0.965:
                text = [
                    f"(EngineCore_0 pid={core}) INFO {stamp()} [scheduler.py:495] Preempted request "
                    f"{rng.choice(open_requests)} has been resumed!"
                ]
                kind = "request_resumed"
            elif roll < 0.975:
                text = [
                    f"(Worker_TP{rng.randint(0, 3)} pid={worker}) WARNING {stamp()} [jit_monitor.py:135] "
                    "Triton kernel JIT compilation during inference: _causal_conv1d_fwd_kernel. "
                    "This causes a latency spike; consider extending warmup to cover this shape/config."
                ]
                kind = "jit_compile"
            elif roll < 0.995:
                text = [
                    f"(EngineCore_0 pid={core}) INFO {stamp()} [gpu_model_runner.py:{rng.randint(1000, 3000)}] "
                    f"Graph capturing finished in {rng.randint(1, 60)} secs, took {rng.uniform(0, 2):.2f} GiB"
                ]
                kind = "unknown (template-mined)"
            elif roll < 0.9995:
                rank = rng.randint(0, 7)
                text = [
                    f"[rank{rank}]:[E{stamp().replace('-', '')[:4]} {stamp()[6:]}.{rng.randint(0, 999999999):09d} "
                    f"ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank {rank}] Timeout at NCCL work: "
                    f"{rng.randint(1, 9999)}, last enqueued NCCL work: 1, last completed NCCL work: -1."
                ]
                kind = "nccl_timeout"
            else:
                prefix = f"(EngineCore_0 pid={core}) ERROR {stamp()} [core.py:700] "
                text = [
                    prefix + "Traceback (most recent call last):",
                    prefix + '  File "/vllm/v1/engine/core.py", line 691, in run_engine_core',
                    prefix + "    engine_core.run_busy_loop()",
                    prefix + "torch.OutOfMemoryError: CUDA out of memory.",
                ]
                kind = "traceback"
            for line in text:
                out.write(line + "\n")
            written += len(text)
            counts[kind] = counts.get(kind, 0) + len(text)
    return counts


# -- children: each prints one JSON line ------------------------------------------------------------
def child_floor(path: str) -> dict:
    import re

    from teller.ingest.logs import vllm

    # the V1 process prefix (optional) and the vLLM header, as one compiled regex
    prefix, engine_header = (
        pattern.pattern.lstrip().removeprefix("^") for pattern in (vllm.PROCESS_PREFIX, vllm.HEADER)
    )
    header = re.compile(f"^(?:{prefix})?{engine_header}", re.DOTALL | re.VERBOSE)
    wall, cpu = time.perf_counter(), time.process_time()
    matched = total = 0
    with open(path, "rb") as handle:
        for raw in handle:
            total += 1
            if header.match(raw.decode("utf-8").rstrip("\n")):
                matched += 1
    return {
        "seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time() - cpu,
        "lines": total,
        "matched": matched,
    }


def child_teller(path: str) -> dict:
    from teller.ingest.logs import read_logs

    wall, cpu = time.perf_counter(), time.process_time()
    table = read_logs([path], year=LOG_YEAR)
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    source = table.sources[0]
    events = table.table.column("event").value_counts().to_pylist()
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "lines": source.lines,
        "records": len(table),
        "events": {e["values"]: e["counts"] for e in events},
        "warnings": table.warnings,
        "arrow_mib": table.table.nbytes / 2**20,
    }


CHILDREN = {"floor": child_floor, "teller": child_teller}


def run_child(name: str, path: Path) -> dict:
    """Run one measurement in a fresh interpreter; adds the child's peak RSS."""
    command = [sys.executable, __file__, "--child", name, str(path)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, text=True
    )
    _, status, usage = os.wait4(process.pid, 0)
    stdout, stderr = process.stdout.read(), process.stderr.read()  # type: ignore[union-attr]
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{name} failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["peak_rss_mib"] = usage.ru_maxrss / 1024  # Linux: KiB
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the generated log here instead of /tmp")
    parser.add_argument("--child", nargs=2, metavar=("NAME", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, path = args.child
        print(json.dumps(CHILDREN[name](path)))
        return 0

    with tempfile.TemporaryDirectory(prefix="teller-bench-logs-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "vllm_v1_generated.log"
        started = time.perf_counter()
        shapes = generate(path, args.lines)
        size_mib = path.stat().st_size / 2**20
        print(
            f"generated {args.lines:,} lines ({size_mib:.1f} MiB) in "
            f"{time.perf_counter() - started:.1f} s: {json.dumps(shapes)}"
        )
        results: dict[str, list[dict]] = {name: [] for name in CHILDREN}
        for _ in range(args.repeats):
            for name in CHILDREN:
                results[name].append(run_child(name, path))
        report(results, args, size_mib)
    return 0


def report(results: dict[str, list[dict]], args: argparse.Namespace, size_mib: float) -> None:
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f}, {args.repeats} rounds, medians"
    )
    print(
        f"{'':8} {'wall s':>8} {'cpu s':>8} {'lines/s':>12} {'cpu lines/s':>12} {'peak RSS MiB':>13}"
    )
    medians = {}
    for name, runs in results.items():
        wall = statistics.median(r["seconds"] for r in runs)
        cpu = statistics.median(r["cpu_seconds"] for r in runs)
        rss = statistics.median(r["peak_rss_mib"] for r in runs)
        lines = runs[0]["lines"]
        medians[name] = wall
        print(
            f"{name:8} {wall:8.2f} {cpu:8.2f} {lines / wall:12,.0f} {lines / cpu:12,.0f} {rss:13.0f}"
        )
    teller = results["teller"][0]
    print(f"teller / floor time: {medians['teller'] / medians['floor']:.1f}x")
    print(
        f"teller: {teller['records']:,} records from {teller['lines']:,} lines, Arrow table "
        f"{teller['arrow_mib']:.0f} MiB ({size_mib:.0f} MiB of text); events {json.dumps(teller['events'])}"
    )
    print(
        f"floor matched {results['floor'][0]['matched']:,} of {results['floor'][0]['lines']:,} lines"
    )
    for warning in teller["warnings"]:
        print(f"teller warning: {warning}")


if __name__ == "__main__":
    sys.exit(main())
