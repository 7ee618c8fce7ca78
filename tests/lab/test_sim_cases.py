"""Simulated cases as every reader sees them: file layout, zero skipped events, launches, joins.

`case(...)` builds a case once per test session (cached), so the fault and fidelity tests share it.
"""

from __future__ import annotations

import atexit
import gzip
import hashlib
import json
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from teller.callchain.tree import EDGE_LAUNCH, CallTree, build_tree
from teller.cli import main
from teller.ingest import read_run, read_trace
from teller.ingest.logs import request_key
from teller.ingest.schema import LAYER_CODE, EventTable
from teller.lab.sim import EngineConfig, FaultSpec, SimConfig, Topology, WorkloadConfig, simulate
from teller.lab.sim.calibration import load
from teller.lab.sim.replica import ReplicaModel
from teller.labels import CaseLabels

_ROOT = Path(tempfile.mkdtemp(prefix="teller-sim-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)  # the session's cases go with it
WINDOW = (10, 30)
STEPS = 40


DEFAULTS = {
    "fault": "none",
    "rank": 1,
    "nodes": 1,
    "gpus": 4,
    "tp": 4,
    "pp": 1,
    "python": False,
    "layers": 2,
    "seed": 0,
    "steps": STEPS,
    "kv_blocks": 4096,
    "output_median": 128,
    "rate": 100.0,
    "initial": 48,
    "variant": "",
    "intensity": 1.0,
    "graphs": True,
}
_CASES: dict[str, tuple[Path, EventTable, CallTree]] = {}


def case(**options) -> tuple[Path, EventTable, CallTree]:
    """A simulated case (built once per session): its directory, events and tree."""
    o = DEFAULTS | options
    name = "-".join(f"{k}{v}" for k, v in sorted(o.items()))
    if name not in _CASES:
        config = SimConfig(
            topology=Topology(o["nodes"], o["gpus"], o["tp"], o["pp"]),
            steps=o["steps"],
            layers=o["layers"],
            python_frames=o["python"],
            engine=EngineConfig(kv_blocks=o["kv_blocks"], cuda_graphs=o["graphs"]),
            workload=WorkloadConfig(
                output_median=o["output_median"],
                rate_per_s=o["rate"],
                initial_requests=o["initial"],
            ),
            fault=FaultSpec(
                o["fault"],
                rank=o["rank"],
                intensity=o["intensity"],
                window=WINDOW,
                variant=o["variant"],
            ),
            seed=o["seed"],
        )
        out = _ROOT / name
        simulate(config, out)
        events = read_run([out / "traces"])
        _CASES[name] = (out, events, build_tree(events))
    return _CASES[name]


def test_case_layout_matches_the_real_lab():
    out, _, _ = case(tp=2, gpus=2)
    assert sorted(p.name for p in (out / "traces").iterdir()) == [
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
    ]
    assert [p.name for p in (out / "logs").iterdir()] == ["server0.log"]
    assert (out / "otlp" / "spans.json").is_file()
    labels = CaseLabels.read(out)
    assert (labels.source, labels.fault, labels.guilty_rank) == ("sim", "none", None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calibration"]["inputs"], "the manifest names the calibration's real inputs"
    assert not list(out.parent.glob(f".{out.name}.*")), "no temporary directory left behind"


@pytest.mark.parametrize("python", [False, True])
def test_every_file_reads_with_zero_skipped_events(python):
    out, events, _ = case(python=python, tp=2, gpus=2, pp=1)
    for source in events.sources:
        assert source.skipped == {}, source.path
        assert source.rank_source == "distributedInfo"
        assert source.clock == "unix"
        assert not [w for w in source.warnings if "skipped" in w]
    # each file alone too, as a user would open it
    for path in sorted((out / "traces").iterdir()):
        assert read_trace(path).sources[0].skipped == {}


def test_every_kernel_has_a_launching_parent():
    _, _, tree = case(python=True, tp=2, gpus=2)
    gpu_codes = [LAYER_CODE[x] for x in ("kernel", "memcpy", "memset")]
    on_gpu = (tree.stream >= 0) & (
        np.isin(tree.layer, gpu_codes) | (tree.layer == LAYER_CODE["comm"])
    )
    assert on_gpu.sum() > 1000
    assert (tree.parent[on_gpu] >= 0).all()
    assert (tree.edge[on_gpu] == EDGE_LAUNCH).all()
    assert not [w for w in tree.warnings if "no launching runtime call" in w]


def test_graph_replays_fan_out_to_kernels_sharing_the_launch_correlation():
    _, events, tree = case(tp=2, gpus=2)
    launches = [i for i in range(len(tree)) if tree.node_name(i) == "cudaGraphLaunch"]
    assert launches, "decode steps replay CUDA graphs"
    fan_out = [len(tree.children(i)) for i in launches]
    assert min(fan_out) >= 1 and max(fan_out) > 5
    corr = events.table.column("correlation").to_numpy()
    for launch in launches[:20]:
        kids = tree.children(launch)
        assert {int(corr[tree.row[k]]) for k in kids} == {int(corr[tree.row[launch]])}


@pytest.mark.parametrize("shape", [(1, 4, 4, 1), (2, 2, 2, 2)])
def test_every_collective_instance_is_joined_across_its_group(shape):
    nodes, gpus, tp, pp = shape
    _, _, tree = case(nodes=nodes, gpus=gpus, tp=tp, pp=pp)
    comm = tree.comm
    assert comm.num_instances > 50
    sizes = np.bincount(comm.instance)
    groups = np.array(comm.group)
    for instance in range(comm.num_instances):
        rows = np.flatnonzero(comm.instance == instance)
        group = groups[rows[0]]
        expected = tp if int(group) <= nodes * gpus // tp else pp  # tp groups are named first
        assert sizes[instance] == expected, (instance, group)
        assert len(set(comm.rank[rows].tolist())) == expected


@pytest.mark.parametrize("shape", [(1, 4, 4, 1), (2, 2, 2, 2)])
def test_nccl_kernels_run_on_their_own_streams_with_stream_metadata(shape):
    """As c10d runs them: compute kernels on the compute stream, each communicator's NCCL kernels
    on a stream of their own (all-reduces on one, each pipeline neighbour's send/recv on
    another), and every stream with work named by its thread metadata, as Kineto writes it."""
    nodes, gpus, tp, pp = shape
    out, _, tree = case(nodes=nodes, gpus=gpus, tp=tp, pp=pp)
    cal = load()
    compute = cal.model["compute_stream"]
    gpu = tree.stream >= 0
    nccl = gpu & (tree.layer == LAYER_CODE["comm"])
    assert nccl.sum() > 100
    assert set(tree.stream[gpu & ~nccl].tolist()) == {compute}
    allreduce = nccl & named(tree, cal.comm["kernel"])
    p2p = nccl & named(tree, cal.p2p["p2p_kernel"])
    for rank in range(nodes * gpus):
        allreduce_streams = set(tree.stream[allreduce & (tree.rank == rank)].tolist())
        p2p_streams = set(tree.stream[p2p & (tree.rank == rank)].tolist())
        assert len(allreduce_streams) == 1 and compute not in allreduce_streams | p2p_streams
        assert len(p2p_streams) == (1 if pp > 1 else 0)  # an end stage has one neighbour
        assert not allreduce_streams & p2p_streams
        with gzip.open(out / "traces" / f"rank{rank}.pt.trace.json.gz") as handle:
            events = json.load(handle)["traceEvents"]
        device = rank % gpus
        ran = {e["tid"] for e in events if e["ph"] == "X" and e["pid"] == device}
        assert all(e["args"]["stream"] == e["tid"] for e in events if e.get("cat") == "kernel")
        names = {
            e["tid"]: e["args"]["name"]
            for e in events
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == device
        }
        sort_index = {
            e["tid"]: e["args"]["sort_index"]
            for e in events
            if e["ph"] == "M" and e["name"] == "thread_sort_index" and e["pid"] == device
        }
        assert names == {s: f"stream {s} " for s in ran}
        assert sort_index == {s: s for s in ran}


SEMANTICS_SHAPES = {
    "tp4-one-node": (1, 4, 4, 1),
    "pp2-across-nodes": (2, 2, 2, 2),
    "tp4-across-nodes": (2, 2, 4, 1),
}


@pytest.mark.parametrize("shape", SEMANTICS_SHAPES.values(), ids=SEMANTICS_SHAPES.keys())
def test_nccl_kernels_obey_collective_semantics(shape):
    """No rank's NCCL kernel ends before the last rank of its group arrived plus the time the
    message needs on the links, from the Topology's figures: a ring all-reduce of n ranks moves
    2(n-1)/n of its bytes through the ring's slowest link after its worst latency; a send/recv
    moves its bytes once over the link between the two ranks."""
    nodes, gpus, tp, pp = shape
    topology = Topology(nodes, gpus, tp, pp)
    _, _, tree = case(nodes=nodes, gpus=gpus, tp=tp, pp=pp)
    starts, ends = comm_kernel_times(tree)
    comm = tree.comm
    kinds: dict[int, set[str]] = {}
    nbytes: dict[int, int] = {}
    for instance, kind, size in zip(comm.instance.tolist(), comm.kind, comm.bytes, strict=True):
        kinds.setdefault(instance, set()).add(kind)
        nbytes[instance] = int(size)
    checked = Counter()
    for instance, arrivals in starts.items():
        ranks = sorted(arrivals)
        size = nbytes[instance]
        if kinds[instance] == {"allreduce"}:
            assert len(ranks) == tp
            ring = [topology.link(a, b) for a, b in zip(ranks, ranks[1:] + ranks[:1], strict=True)]
            bandwidth = min(bytes_per_ns for bytes_per_ns, _ in ring)
            latency = max(latency_ns for _, latency_ns in ring)
            transfer_ns = latency + 2 * (tp - 1) / tp * size / bandwidth
        else:
            assert kinds[instance] == {"send", "recv"} and len(ranks) == 2
            bandwidth, latency = topology.link(*ranks)
            transfer_ns = latency + size / bandwidth
        last_arrival = max(arrivals.values())
        for rank, end in ends[instance].items():
            # the simulator counts whole nanoseconds, so allow its rounding down
            assert end - last_arrival >= transfer_ns - 1, (instance, rank, kinds[instance])
        checked["allreduce" if "allreduce" in kinds[instance] else "p2p"] += 1
    assert checked["allreduce"] > 50
    assert checked["p2p"] == (STEPS * tp if pp > 1 else 0)  # every step, each tp rank's pipe


def named(tree: CallTree, name: str) -> np.ndarray:
    """Nodes called `name` (none if the tree never names it)."""
    return tree.name == (tree.names.index(name) if name in tree.names else -1)


def comm_kernel_times(tree: CallTree) -> tuple[dict, dict]:
    """Per collective instance: each rank's NCCL kernel start and end (GPU side)."""
    comm = tree.comm
    starts: dict[int, dict[int, int]] = {}
    ends: dict[int, dict[int, int]] = {}
    gpu_comm = np.flatnonzero((tree.layer == LAYER_CODE["comm"]) & (tree.stream >= 0))
    root_instance = dict(zip(comm.node.tolist(), comm.instance.tolist(), strict=True))
    for node in gpu_comm.tolist():
        up = node
        while up >= 0 and up not in root_instance:
            up = int(tree.parent[up])
        if up < 0:
            continue
        instance = root_instance[up]
        starts.setdefault(instance, {})[int(tree.rank[node])] = int(tree.start[node])
        ends.setdefault(instance, {})[int(tree.rank[node])] = int(tree.start[node] + tree.dur[node])
    return starts, ends


def test_every_gpu_activity_carries_its_own_launch_flow_end():
    """Kineto writes one `ac2g` flow end per GPU activity, at its start on its stream, with the
    launch's correlation id: a cudaGraphLaunch's every replayed kernel has one (as in the real
    hta/queue_len trace, 345 flow ends for the 345 activities of its 70 graph launches)."""
    out, _, _ = case(tp=2, gpus=2)
    with gzip.open(out / "traces" / "rank0.pt.trace.json.gz") as handle:
        events = json.load(handle)["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    flow_ends = Counter((e["id"], e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "f")
    assert flow_ends == Counter(
        (e["args"]["correlation"], e["pid"], e["tid"], e["ts"]) for e in gpu
    )
    per_launch = Counter(e["args"]["correlation"] for e in gpu)
    assert max(per_launch.values()) > 5, "graph replays fan out to many kernels"


def test_flow_events_alone_place_each_kernel_under_its_launch_once(tmp_path):
    """A reader that links launches by flow events (correlation ids stripped from the GPU rows, as
    in legacy files) builds the same launch edges as one that reads the ids."""
    out, _, _ = case(tp=2, gpus=2)
    path = out / "traces" / "rank0.pt.trace.json.gz"
    with gzip.open(path) as handle:
        document = json.load(handle)
    for event in document["traceEvents"]:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            del event["args"]["correlation"]
    stripped = tmp_path / path.name
    with gzip.open(stripped, "wt") as handle:
        json.dump(document, handle)

    def launch_edges(tree: CallTree) -> Counter:
        gpu = np.flatnonzero(tree.stream >= 0)
        assert (tree.edge[gpu] == EDGE_LAUNCH).all()
        launcher_starts = tree.start[tree.parent[gpu]].tolist()
        return Counter(zip(launcher_starts, tree.start[gpu].tolist(), strict=True))

    by_ids = launch_edges(build_tree(read_trace(path)))
    by_flows = launch_edges(build_tree(read_trace(stripped)))
    assert by_flows == by_ids
    assert max(by_ids.values()) == 1, "no kernel is placed twice"


def test_step_annotations_carry_the_batch():
    _, _, tree = case(tp=2, gpus=2)
    steps = tree.steps
    assert len(steps) == 2 * STEPS
    assert {"prefill", "decode"} <= set(steps.kind)
    assert (steps.context_tokens[np.array(steps.kind) == "decode"] == 0).all()
    assert (steps.generation_requests[np.array(steps.kind) == "prefill"] == 0).all()


def test_logs_and_spans_have_the_documented_shapes():
    out, _, _ = case(tp=2, gpus=2, output_median=8)
    lines = (out / "logs" / "server0.log").read_text().splitlines()
    shape = re.compile(
        r"^\((APIServer|EngineCore_0) pid=\d+\) (INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\] "
    )
    assert lines and all(shape.match(line) for line in lines)
    assert sum("Iteration(" in line for line in lines) == STEPS
    assert any("Added request cmpl-" in line for line in lines)
    spans = json.loads((out / "otlp" / "spans.json").read_text())
    records = spans["resourceSpans"][0]["scopeSpans"][0]["spans"]
    finished = sum("Finished request" in line for line in lines)
    assert len(records) == finished > 0
    attributes = {a["key"] for a in records[0]["attributes"]}
    assert {
        "gen_ai.request.id",
        "gen_ai.latency.time_to_first_token",
        "gen_ai.usage.prompt_tokens",
    } <= attributes
    assert all(r["name"] == "llm_request" and r["kind"] == 2 for r in records)
    models = {
        a["value"]["stringValue"]
        for r in records
        for a in r["attributes"]
        if a["key"] == "gen_ai.response.model"
    }
    assert models == {"Qwen/Qwen1.5-0.5B-Chat"}  # the calibrated model's hub id


def test_ground_truth_has_the_real_labs_files_and_who_printed_each_line():
    out, _, tree = case(tp=2, gpus=2, output_median=8)
    truth = out / "ground_truth"
    steps = [json.loads(line) for line in (truth / "steps.jsonl").open()]
    # the lab's keys (teller.lab.serve.worker._step_record) plus the replica
    assert set(steps[0]) == {"step", "start_ns", "end_ns", "annotation", "requests", "replica"}
    rank0 = np.flatnonzero(tree.steps.rank == 0)
    assert [s["step"] for s in steps] == tree.steps.index[rank0].tolist() == list(range(STEPS))
    assert [s["annotation"] for s in steps] == [tree.steps.name[k] for k in rank0]
    for s, k in zip(steps, rank0, strict=True):
        phases = Counter(r["phase"] for r in s["requests"])
        assert phases["prefill"] == tree.steps.context_requests[k]
        assert phases["decode"] == tree.steps.generation_requests[k]
        assert 0 <= tree.steps.start_ns[k] - s["start_ns"] < 100_000  # the rank's own jitter
    requests = [json.loads(line) for line in (truth / "requests.jsonl").open()]
    assert {r["request_id"] for s in steps for r in s["requests"]} <= {
        r["request_id"] for r in requests
    }
    finished = [r for r in requests if "finish_ns" in r]
    assert finished and all(
        r["arrival_ns"] <= r["first_token_ns"] <= r["finish_ns"] for r in finished
    )
    # lines.jsonl: one row per log line, naming the process its prefix names
    log = (out / "logs" / "server0.log").read_text().splitlines()
    lines = [json.loads(line) for line in (truth / "lines.jsonl").open()]
    assert [(row["log"], row["line"]) for row in lines] == [
        ("logs/server0.log", n) for n in range(1, len(log) + 1)
    ]
    for row, text in zip(lines, log, strict=True):
        assert text.startswith(f"({row['process']} pid={row['pid']}) "), text
        if row["request_id"] is not None:
            assert request_key(row["request_id"]) in text
    ran: dict[str, list[int]] = {}
    for s in steps:
        for r in s["requests"]:
            ran.setdefault(r["request_id"], []).append(s["step"])
    for row, text in zip(lines, log, strict=True):
        if "Added request" in text or "Received request" in text:
            assert row["step"] == ran.get(row["request_id"], [None])[0]
        elif "Finished request" in text:
            assert row["step"] == ran[row["request_id"]][-1]
        elif "Iteration(" in text:
            assert f"Iteration({row['step']})" in text
    assert sum(row["step"] is not None and row["request_id"] is None for row in lines) == STEPS


def test_same_seed_gives_identical_bytes_and_another_seed_does_not(tmp_path):
    config = SimConfig(Topology(1, 2, 2, 1), steps=12, layers=1, python_frames=True)

    def digest(out: Path) -> dict[str, str]:
        return {
            str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "labels.json"
        }

    simulate(config, tmp_path / "a")
    simulate(config, tmp_path / "b", jobs=2)
    import dataclasses

    simulate(dataclasses.replace(config, seed=1), tmp_path / "c")
    a, b, c = digest(tmp_path / "a"), digest(tmp_path / "b"), digest(tmp_path / "c")
    assert a == b
    assert a["traces/rank0.pt.trace.json.gz"] != c["traces/rank0.pt.trace.json.gz"]
    # labels name their case directory; everything else is byte-identical
    la = json.loads((tmp_path / "a" / "labels.json").read_text())
    lb = json.loads((tmp_path / "b" / "labels.json").read_text())
    assert {**la, "case_id": ""} == {**lb, "case_id": ""}


def test_shared_draws_are_kept_for_one_step_only(tmp_path, monkeypatch):
    """The host-time draws a replica's ranks share are dropped when the step ends, so the model's
    memory does not grow with the run (at most one draw per layer and one per collective)."""
    sizes: list[int] = []
    run_step = ReplicaModel.run_step

    def recording(self: ReplicaModel, plan):
        result = run_step(self, plan)
        sizes.append(len(self._shared_cpu) + len(self._shared_comm_host))
        return result

    monkeypatch.setattr(ReplicaModel, "run_step", recording)
    layers, tp, pp = 2, 2, 2
    config = SimConfig(Topology(2, 2, tp, pp), steps=30, layers=layers, python_frames=False)
    simulate(config, tmp_path / "case")
    assert len(sizes) == 30
    allreduces = 2 * layers  # after attention and after the MLP of every layer
    exchanges = tp * (pp - 1)  # one send/recv per pipeline group and stage boundary
    assert max(sizes) == layers + allreduces + exchanges


def test_trace_header_is_kineto_shaped():
    out, _, _ = case(tp=2, gpus=2)
    with gzip.open(out / "traces" / "rank1.pt.trace.json.gz") as handle:
        document = json.load(handle)
    keys = list(document)
    assert keys[0] == "schemaVersion" and keys[-2:] == ["traceEvents", "traceName"]
    info = document["distributedInfo"]
    assert info["rank"] == 1 and info["world_size"] == 2
    assert {tuple(g["ranks"]) for g in info["pg_config"]} >= {(0, 1)}
    flows = [e for e in document["traceEvents"] if e.get("cat") == "ac2g"]
    assert {e["ph"] for e in flows} == {"s", "f"}
    assert all(e["bp"] == "e" for e in flows if e["ph"] == "f")
    kernel = next(e for e in document["traceEvents"] if e.get("cat") == "kernel")
    assert list(kernel) == ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
    comm = next(e for e in document["traceEvents"] if e.get("name") == "record_param_comms")
    for key in (
        "Collective name",
        "dtype",
        "In msg nelems",
        "Out msg nelems",
        "Group size",
        "Process Group Name",
        "Process Group Ranks",
        "Seq",
        "Rank",
    ):
        assert key in comm["args"]


def test_bad_requests_fail_cleanly_with_nothing_written(tmp_path, capsys):
    out = tmp_path / "case"
    status = main(
        [
            "-q",
            "lab",
            "sim",
            "--out",
            str(out),
            "--tp",
            "1",
            "--gpus-per-node",
            "1",
            "--fault",
            "straggler",
        ]
    )
    assert status == 2
    assert "straggler needs tensor parallelism" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.iterdir())
    (out / "x").mkdir(parents=True)
    assert main(["-q", "lab", "sim", "--out", str(out), "--steps", "2"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["-q", "lab", "sim", "--out", str(tmp_path / "w"), "--window", "5:2"]) == 2


def test_cli_writes_a_case(tmp_path, capsys):
    out = tmp_path / "case"
    status = main(
        [
            "-q",
            "lab",
            "sim",
            "--out",
            str(out),
            "--gpus-per-node",
            "2",
            "--tp",
            "2",
            "--steps",
            "5",
            "--layers",
            "1",
            "--fault",
            "gpu_throttle",
            "--rank",
            "1",
            "--window",
            "1:3",
            "--jobs",
            "1",
            "--model",
            "org/served-model",
        ]
    )
    assert status == 0
    assert "gpu_throttle" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["model"] == "org/served-model"
    labels = CaseLabels.read(out)
    assert labels.steps == [1, 2] and labels.guilty_rank == 1 and labels.view == "V"
    assert labels.window_ns[0] < labels.window_ns[1]


def test_python_parent_ids_name_the_enclosing_frame():
    out, _, _ = case(python=True, tp=2, gpus=2)
    with gzip.open(out / "traces" / "rank0.pt.trace.json.gz") as handle:
        events = json.load(handle)["traceEvents"]
    frames = [e for e in events if e.get("cat") == "python_function"]
    by_id = {e["args"]["Python id"]: e for e in frames}
    roots = 0
    for frame in frames:
        parent_id = frame["args"]["Python parent id"]
        if parent_id is None:
            roots += 1
            continue
        parent = by_id[parent_id]
        assert parent["ts"] <= frame["ts"]
        assert frame["ts"] + frame["dur"] <= parent["ts"] + parent["dur"] + 0.001
    assert roots == STEPS  # one root frame per step, under the step annotation


def test_cli_link_speeds_reach_the_topology_and_the_collectives(tmp_path, capsys):
    """--network-gbps slows the cross-node transfers it names, and the manifest records it."""

    def allreduce_us(out: Path) -> float:
        tree = build_tree(read_run([out / "traces"]))
        names = [tree.node_name(n) for n in range(len(tree))]
        durations = [tree.dur[n] for n, name in enumerate(names) if "Kernel_AllReduce" in name]
        assert durations
        return float(np.median(durations)) / 1000

    common = ["-q", "lab", "sim", "--nodes", "2", "--gpus-per-node", "2", "--tp", "4"]
    common += ["--steps", "6", "--layers", "1", "--no-python", "--jobs", "1"]
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    assert main([*common, "--out", str(fast)]) == 0
    assert main([*common, "--out", str(slow), "--network-gbps", "5"]) == 0
    manifest = json.loads((slow / "manifest.json").read_text())
    assert manifest["config"]["topology"]["network_bytes_per_ns"] == 5.0
    assert allreduce_us(slow) > 2 * allreduce_us(fast)
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "bad"), "--nvlink-gbps", "0"]) == 2
    assert "link bandwidths must be positive" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
