"""GPU idle gaps are blamed on the host work that delayed the next launch (teller.localize.idle)."""

from __future__ import annotations

import json
from pathlib import Path

from teller.callchain.tree import build_tree
from teller.ingest import read_run
from teller.localize import NumericLocalizer
from teller.localize.idle import idle_gaps

STEPS = 12
SLOW_STEPS = (6, 7)


def write_gpu_run(path: Path, slow_host_us: float, slow_layer: int | None = None) -> Path:
    """One rank; per step 4 layers of aten::linear (10 µs on the host, launching a 40 µs GEMM)
    and aten::add (5 µs, launching a 10 µs kernel). The GPU keeps up with the host, so it idles
    only while the host is slow: in SLOW_STEPS, rank 0's `aten::add` takes `slow_host_us`."""
    events: list[dict] = []
    corr = 0
    clock = 1000.0
    for step in range(STEPS):
        start = clock
        t = clock
        gpu_free = clock
        body: list[dict] = []
        for layer in range(4):
            slow = step in SLOW_STEPS and (slow_layer is None or layer == slow_layer)
            for name, host_us, kernel, kernel_us in (
                ("aten::linear", 10.0, "gemm_kernel", 40.0),
                ("aten::add", slow_host_us if slow else 5.0, "add_kernel", 10.0),
            ):
                corr += 1
                body.append(cpu(name, "cpu_op", t, host_us))
                launch_at = t + host_us - 3.0  # the launch closes the operator
                body.append(cpu("cudaLaunchKernel", "cuda_runtime", launch_at, 2.0, corr))
                k_start = max(gpu_free, launch_at + 2.0)
                body.append(gpu(kernel, k_start, kernel_us, corr))
                gpu_free = k_start + kernel_us
                t += host_us + 1.0
        end = max(t, gpu_free) + 5.0
        events.append(
            cpu("execute_context_1(64)_generation_0(0)", "user_annotation", start, end - start)
        )
        events.extend(body)
        clock = end + 10.0
    document = {
        "distributedInfo": {"rank": 0, "world_size": 1},
        "baseTimeNanoseconds": 1,
        "traceEvents": events,
    }
    path.write_text(json.dumps(document))
    return path


def cpu(name: str, cat: str, ts: float, dur: float, correlation: int | None = None) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    if correlation is not None:
        event["args"] = {"correlation": correlation}
    return event


def gpu(name: str, ts: float, dur: float, correlation: int) -> dict:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": 7,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": correlation, "stream": 7, "device": 0},
    }


def test_gaps_land_on_the_slow_host_operator(tmp_path: Path) -> None:
    tree = build_tree(read_run([write_gpu_run(tmp_path / "rank0.json", slow_host_us=120.0)]))
    gaps = idle_gaps(tree)
    add = tree.names.index("aten::add")
    for step in SLOW_STEPS:
        per_name = gaps[(0, step)]
        assert max(per_name, key=per_name.get) == add
        assert per_name[add] > 4 * 50_000  # ~4 gaps of roughly 120 - 40 - 10 - ... µs
    quiet = sum(sum(v.values()) for (r, s), v in gaps.items() if s not in SLOW_STEPS)
    assert quiet == 0


def test_the_localizer_names_the_host_work_behind_the_idle_gpu(tmp_path: Path) -> None:
    tree = build_tree(read_run([write_gpu_run(tmp_path / "rank0.json", slow_host_us=120.0)]))
    result = NumericLocalizer().score(tree)
    assert [s.iteration for s in result.anomalous_steps()] == list(SLOW_STEPS)
    for step in SLOW_STEPS:
        idle = [c for c in result.candidates[step] if c.kind == "idle"]
        assert idle and idle[0].operator == "aten::add" and idle[0].rank == 0
        assert result.candidates[step][0].operator == "aten::add"


def test_without_normal_steps_an_operator_is_judged_against_its_other_layers(tmp_path: Path):
    """One rank and no normal step to compare with: the slow layer's add stands out against the
    same operator in the step's other layers."""
    from teller.callchain.facts import RunFacts
    from teller.localize.layers import layer_outliers

    path = write_gpu_run(tmp_path / "rank0.json", slow_host_us=400.0, slow_layer=2)
    tree = build_tree(read_run([path]))
    found = layer_outliers(RunFacts(tree), min_share=0.0)[SLOW_STEPS[0]]
    top = found[0]
    assert (tree.names[top.name], top.rank, top.layer) == ("aten::add", 0, 2)
    assert top.excess_ns >= 300_000  # one layer's 400 µs against ~5 µs
