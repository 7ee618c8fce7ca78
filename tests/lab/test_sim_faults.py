"""Each simulated fault leaves its signature in numbers, read back through teller's own reader.

Cases run 40 steps with the fault on steps 10..29 at intensity 1 (see test_sim_cases.case); each
test measures the fault's effect inside the window against outside it, or the guilty rank against
its peers, so it fails if the injection stops working or lands on the wrong rank.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re

import numpy as np

from lab.test_sim_cases import STEPS, WINDOW, case, comm_kernel_times
from teller.callchain.tree import CallTree
from teller.ingest.schema import LAYER_CODE
from teller.lab.sim.engine import EngineConfig, Scheduler, WorkloadConfig
from teller.lab.sim.faults import NET_DELAY_UNIT_NS, STRAGGLER_UNIT_NS
from teller.lab.sim.topology import NETWORK_LATENCY_NS, NVLINK_LATENCY_NS
from teller.labels import CaseLabels, equivalent_ranks


def step_index(tree: CallTree) -> np.ndarray:
    """Each node's rank-local step ordinal (-1 outside steps)."""
    return np.where(tree.step >= 0, tree.steps.index[np.maximum(tree.step, 0)], -1)


def in_window(tree: CallTree) -> np.ndarray:
    index = step_index(tree)
    return (index >= WINDOW[0]) & (index < WINDOW[1])


def outside_window(tree: CallTree) -> np.ndarray:
    index = step_index(tree)
    return (index >= 0) & ~in_window(tree)


def kernels(tree: CallTree) -> np.ndarray:
    return tree.layer == LAYER_CODE["kernel"]


def named(tree: CallTree, prefix: str) -> np.ndarray:
    ids = [i for i, n in enumerate(tree.names) if n.startswith(prefix)]
    return np.isin(tree.name, ids)


def instance_step(tree: CallTree) -> dict[int, int]:
    index = step_index(tree)
    return dict(zip(tree.comm.instance.tolist(), index[tree.comm.node].tolist(), strict=True))


def test_gpu_throttle_slows_only_the_guilty_rank_inside_the_window():
    out, _, tree = case(fault="gpu_throttle", rank=1)
    k, w = kernels(tree), in_window(tree)
    ratio = {}
    for r in range(4):
        mine = k & (tree.rank == r)
        ratio[r] = tree.dur[mine & w].sum() / tree.dur[mine & outside_window(tree)].sum()
    peers = [ratio[r] for r in (0, 2, 3)]
    assert ratio[1] > 1.7 * max(peers), ratio
    labels = CaseLabels.read(out)
    assert labels.guilty_operator in tree.names and "gemm" in labels.guilty_operator
    assert labels.steps == list(range(*WINDOW))


def test_gpu_throttle_slowdown_follows_its_intensity():
    """Intensity x makes the guilty rank's kernels (1 + x)× as long as its peers' in the same
    steps: the slowdown grows with intensity and sits near 1 + x."""

    def slowdown(intensity: float) -> float:
        _, _, tree = case(fault="gpu_throttle", rank=1, tp=2, gpus=2, intensity=intensity)
        k = kernels(tree) & in_window(tree)
        return tree.dur[k & (tree.rank == 1)].sum() / tree.dur[k & (tree.rank == 0)].sum()

    low, high = slowdown(0.25), slowdown(2.0)
    assert high > 2 * low
    for intensity, measured in ((0.25, low), (2.0, high)):
        assert abs(measured / (1 + intensity) - 1) < 0.05, (intensity, measured)


def test_gpu_contention_slows_the_rank_and_raises_its_variance():
    _, _, tree = case(fault="gpu_contention", rank=2)
    base = case()[2]
    k = kernels(tree) & (tree.rank == 2) & in_window(tree)
    k_base = kernels(base) & (base.rank == 2) & in_window(base)
    assert (
        tree.dur[k].sum() > 1.5 * tree.dur[kernels(tree) & (tree.rank == 0) & in_window(tree)].sum()
    )

    # the same kernel's spread (log-std per kernel name) rises well above the clean run's
    def spread(t, mask):
        logs = np.log(t.dur[mask].astype(float))
        names = t.name[mask]
        return np.mean(
            [logs[names == n].std() for n in np.unique(names) if (names == n).sum() > 20]
        )

    assert spread(tree, k) > 2 * spread(base, k_base)


def test_kv_pressure_preempts_and_recomputes_prefills_with_log_lines():
    out, _, tree = case(fault="kv_pressure", rank=0)
    _, _, base = case()
    lines = (out / "logs" / "server0.log").read_text().splitlines()
    step_of_line, current = [], -1
    for line in lines:
        match = re.search(r"Iteration\((\d+)\)", line)
        if match:
            current = int(match.group(1))
        step_of_line.append(current + 1 if not match else current)
    preempted = [s for s, line in zip(step_of_line, lines, strict=True) if "is preempted" in line]
    assert preempted and min(preempted) >= WINDOW[0] and max(preempted) < WINDOW[1]
    victims = set(re.findall(r"Sequence group (\S+) is preempted", "\n".join(lines)))
    resumed = set(re.findall(r"Preempted request (\S+) has been resumed", "\n".join(lines)))
    assert resumed and resumed <= victims  # their prefills are recomputed

    def batch_in_window(t: CallTree) -> float:
        s = t.steps
        w = (s.rank == 0) & (s.index >= WINDOW[0]) & (s.index < WINDOW[1])
        return float(np.median(s.generation_requests[w] + s.context_requests[w]))

    assert batch_in_window(tree) < 0.8 * batch_in_window(base)


def test_a_resumed_request_recomputes_its_context_then_decodes_again():
    """Recompute mode: a preempted request prefills its prompt and every token it had generated,
    then decodes one token a step again, as before its preemption."""
    out, _, _ = case(fault="kv_pressure", rank=0)
    log = (out / "logs" / "server0.log").read_text().splitlines()
    lines = [json.loads(line) for line in (out / "ground_truth" / "lines.jsonl").open()]
    preempted_at: dict[str, list[int]] = {}
    for row, text in zip(lines, log, strict=True):
        if "is preempted" in text:
            preempted_at.setdefault(row["request_id"], []).append(row["step"])
    entries: dict[str, list[tuple[int, str, int]]] = {}
    for line in (out / "ground_truth" / "steps.jsonl").open():
        step = json.loads(line)
        for r in step["requests"]:
            entries.setdefault(r["request_id"], []).append((step["step"], r["phase"], r["tokens"]))
    checked = 0
    for request_id, (preempted,) in [(k, v) for k, v in preempted_at.items() if len(v) == 1]:
        before = [e for e in entries[request_id] if e[0] < preempted]
        after = [e for e in entries[request_id] if e[0] > preempted]
        decodes = sum(phase == "decode" for _, phase, _ in before)
        phases = [phase for _, phase, _ in after]
        if not decodes or "decode" not in phases:
            continue  # preempted in its first prefill, or the run ended during the recompute
        recompute = after[: phases.index("decode")]
        prompt = sum(tokens for _, phase, tokens in before if phase == "prefill")
        assert {phase for _, phase, _ in recompute} == {"prefill"}
        assert sum(tokens for _, _, tokens in recompute) == prompt + 1 + decodes
        assert set(phases[len(recompute) :]) == {"decode"}
        checked += 1
    assert checked >= 3


def test_kv_pressure_at_high_intensity_never_overcommits_the_cache():
    """At intensity 3 the cache shrinks to 1/13: the pressure takes free blocks only, the rest as
    requests release theirs, so the logged usage reaches but never passes 100%."""
    out, _, _ = case(fault="kv_pressure", rank=0, tp=2, gpus=2, intensity=3.0)
    log = (out / "logs" / "server0.log").read_text()
    usage = [float(u) for u in re.findall(r"GPU KV cache usage: ([\d.]+)%", log)]
    assert len(usage) >= STEPS
    assert 99.0 <= max(usage) <= 100.0
    assert "is preempted" in log


def test_reserving_cache_takes_only_free_blocks_until_running_requests_release_theirs():
    engine = EngineConfig(kv_blocks=100, block_size=16)
    scheduler = Scheduler(
        engine, WorkloadConfig(initial_requests=4), np.random.default_rng(0), 0, 0
    )
    plan = scheduler.plan(0, 0)
    held = engine.kv_blocks - scheduler.free_blocks
    assert plan.prefill and held > 0
    scheduler.reserve(95)
    assert (scheduler.free_blocks, scheduler.reserved_blocks) == (0, engine.kv_blocks - held)
    assert scheduler.kv_usage == 1.0
    for request in list(scheduler.running):  # finished requests give their blocks back
        request.output_tokens = 0
    scheduler.complete(plan, 1_000)
    scheduler.reserve(95)
    assert (scheduler.free_blocks, scheduler.reserved_blocks) == (5, 95)
    scheduler.reserve(0)
    assert (scheduler.free_blocks, scheduler.reserved_blocks, scheduler.kv_usage) == (100, 0, 0.0)


def test_host_cpu_contention_stretches_launches_and_opens_gpu_bubbles():
    _, _, tree = case(fault="host_cpu_contention", rank=3)
    w = in_window(tree)
    launches = named(tree, "cudaLaunchKernel") & w

    def median_launch(r: int) -> float:
        return float(np.median(tree.dur[launches & (tree.rank == r)]))

    assert median_launch(3) > 1.6 * max(median_launch(r) for r in (0, 1, 2))

    def idle_and_comm_ns(r: int) -> tuple[int, int]:
        """GPU idle time within the window's steps, and time inside NCCL kernels."""
        s = tree.steps
        steps = (s.rank == r) & (s.index >= WINDOW[0]) & (s.index < WINDOW[1])
        gpu = (tree.stream >= 0) & (tree.rank == r) & w
        comm = gpu & (tree.layer == LAYER_CODE["comm"])
        return int(s.dur_ns[steps].sum() - tree.dur[gpu].sum()), int(tree.dur[comm].sum())

    idle, comm = zip(*(idle_and_comm_ns(r) for r in range(4)), strict=True)
    # the guilty GPU idles between late launches while its peers wait inside the collectives
    assert idle[3] > 3 * max(idle[:3])
    assert comm[3] < min(comm[:3]) / 3


def test_host_cpu_contention_delays_the_graph_launch_where_a_step_replays_a_graph():
    """Why either launch call is the guilty operator (teller.labels.equivalent_operators):
    a decode step that replays a CUDA graph launches its kernels through one cudaGraphLaunch,
    and that call is what the busy host stretches."""
    _, _, tree = case(fault="host_cpu_contention", rank=3)
    graph = named(tree, "cudaGraphLaunch")
    steps_with_graphs = set(step_index(tree)[graph & in_window(tree)].tolist())
    assert steps_with_graphs

    def median(mask: np.ndarray) -> float:
        return float(np.median(tree.dur[graph & mask]))

    assert median(in_window(tree) & (tree.rank == 3)) > 1.6 * median(
        in_window(tree) & (tree.rank != 3)
    )
    assert median(in_window(tree) & (tree.rank == 3)) > 1.6 * median(
        outside_window(tree) & (tree.rank == 3)
    )


def sends(tree: CallTree) -> np.ndarray:
    """Pipeline send kernels (stage 0 ranks 0 and 1 in the 2×2, tp2 pp2 case)."""
    return named(tree, "ncclKernel_SendRecv") & np.isin(tree.rank, [0, 1]) & (tree.stream >= 0)


def test_net_delay_adds_latency_to_messages_over_the_guilty_nodes_link():
    _, _, tree = case(fault="net_delay", rank=0, nodes=2, gpus=2, tp=2, pp=2)
    s = sends(tree)
    inside, outside = tree.dur[s & in_window(tree)], tree.dur[s & outside_window(tree)]
    assert inside.min() >= NET_DELAY_UNIT_NS + outside.min()
    assert outside.min() < NET_DELAY_UNIT_NS / 2


def test_bandwidth_throttle_halves_the_guilty_nodes_link_bandwidth():
    _, _, tree = case(fault="bandwidth_throttle", rank=0, nodes=2, gpus=2, tp=2, pp=2)
    starts, ends = comm_kernel_times(tree)
    steps = instance_step(tree)
    comm = tree.comm
    facts = {
        int(i): (k, int(b)) for i, k, b in zip(comm.instance, comm.kind, comm.bytes, strict=True)
    }
    inside, outside = [], []
    for instance, by_rank in starts.items():
        kind, nbytes = facts[instance]
        if kind not in ("send", "recv") or nbytes < 1 << 20:
            continue
        sender = min(by_rank)  # stage 0 sends
        per_byte = (ends[instance][sender] - by_rank[sender] - NETWORK_LATENCY_NS) / nbytes
        (inside if WINDOW[0] <= steps[instance] < WINDOW[1] else outside).append(per_byte)
    assert inside and outside
    assert min(inside) > 1.8 * min(outside)


def test_straggler_arrives_last_and_waits_least():
    out, _, tree = case(fault="straggler", rank=2)
    starts, ends = comm_kernel_times(tree)
    steps = instance_step(tree)
    last, shortest, total, last_outside, total_outside = 0, 0, 0, 0, 0
    for instance, by_rank in starts.items():
        late = max(by_rank, key=by_rank.get)
        durations = {r: ends[instance][r] - by_rank[r] for r in by_rank}
        if WINDOW[0] <= steps[instance] < WINDOW[1]:
            total += 1
            last += late == 2
            shortest += min(durations, key=durations.get) == 2
        else:
            total_outside += 1
            last_outside += late == 2
    assert total > 50
    assert last / total >= 0.9 and shortest / total >= 0.9
    assert last_outside / total_outside < 0.6
    # the delay shows in the peers' waits: they sit in the collective about the straggler's delay
    peers_wait = [
        np.median([ends[i][r] - starts[i][r] for i in starts if WINDOW[0] <= steps[i] < WINDOW[1]])
        for r in (0, 1, 3)
    ]
    assert min(peers_wait) > 0.5 * STRAGGLER_UNIT_NS
    assert CaseLabels.read(out).view == "H"


def test_link_contention_slows_the_rings_transfers():
    _, _, tree = case(fault="link_contention", rank=1)
    starts, ends = comm_kernel_times(tree)
    steps = instance_step(tree)
    nbytes = dict(zip(tree.comm.instance.tolist(), tree.comm.bytes.tolist(), strict=True))
    inside, outside = [], []
    for instance, by_rank in starts.items():
        if nbytes[instance] < 1 << 20:
            continue  # latency-bound messages do not show bandwidth
        transfer = min(ends[instance].values()) - max(by_rank.values()) - NVLINK_LATENCY_NS
        (inside if WINDOW[0] <= steps[instance] < WINDOW[1] else outside).append(
            transfer / nbytes[instance]
        )
    assert inside and outside
    assert np.median(inside) > 1.8 * np.median(outside)


def test_a_contended_link_anywhere_in_the_ring_leaves_the_same_trace():
    """Why the scoreboard accepts any rank of the ring for link_contention (teller.labels.equivalent_ranks):
    the ring all-reduce runs at its slowest link's pace, so which link it is does not show."""
    first, _, _ = case(fault="link_contention", rank=1)  # link 1–2
    other, _, _ = case(fault="link_contention", rank=3)  # link 3–0
    traces = sorted(p.relative_to(first) for p in (first / "traces").rglob("*") if p.is_file())
    assert traces
    for path in traces:
        assert (first / path).read_bytes() == (other / path).read_bytes(), path
    assert equivalent_ranks(CaseLabels.read(first)) == set(range(4))


def test_a_node_network_fault_anywhere_on_a_ring_across_nodes_leaves_the_same_trace():
    """Why the scoreboard accepts any rank of a ring that crosses nodes for net_delay and
    bandwidth_throttle (teller.labels.equivalent_ranks); across pipeline stages the sends of the
    guilty node show, so there only its own ranks are right."""
    ring = {"fault": "net_delay", "nodes": 4, "gpus": 2, "tp": 8}
    first, _, _ = case(**ring, rank=1)  # node 0
    other, _, _ = case(**ring, rank=5)  # node 2
    traces = sorted(p.relative_to(first) for p in (first / "traces").rglob("*") if p.is_file())
    assert len(traces) == 8
    for path in traces:
        assert (first / path).read_bytes() == (other / path).read_bytes(), path
    assert equivalent_ranks(CaseLabels.read(first)) == set(range(8))
    staged = {"fault": "net_delay", "nodes": 4, "gpus": 2, "tp": 4, "pp": 2}
    first, _, _ = case(**staged, rank=0)  # node 0: sends 0, 1 -> 4, 5
    other, _, _ = case(**staged, rank=2)  # node 1: sends 2, 3 -> 6, 7
    differ = [p for p in traces if (first / p).read_bytes() != (other / p).read_bytes()]
    assert differ
    assert equivalent_ranks(CaseLabels.read(first)) == {0, 1}


def test_kernel_regression_swaps_one_gemm_on_one_rank_and_slows_it():
    out, _, tree = case(fault="kernel_regression", rank=0)
    labels = CaseLabels.read(out)
    swapped = named(tree, labels.guilty_operator.split("<")[0]) & kernels(tree)
    assert swapped.sum() > 0
    assert set(tree.rank[swapped].tolist()) == {0}
    assert in_window(tree)[swapped].all()
    gemm = named(tree, "sm90_xmma_gemm") & in_window(tree) & (tree.rank == 1)
    assert np.median(tree.dur[swapped]) > 1.5 * np.median(tree.dur[gemm])
    # the labels name the window's steps that launched the swapped kernel, not its graph replays
    with_swap = set(step_index(tree)[swapped].tolist())
    assert labels.steps == sorted(with_swap)
    assert 0 < len(labels.steps) < WINDOW[1] - WINDOW[0]


def test_kernel_regression_labels_leave_out_steps_it_did_not_change():
    """An eager-only run: every window step launches the swapped GEMM, so all are labelled."""
    out, _, _ = case(fault="kernel_regression", rank=0, graphs=False)
    assert CaseLabels.read(out).steps == list(range(*WINDOW))


def test_graph_fallback_makes_one_rank_launch_decode_kernels_eagerly():
    out, _, tree = case(fault="kernel_regression", rank=3, variant="graph_fallback")
    assert CaseLabels.read(out).guilty_operator == "cudaLaunchKernel"
    graph = named(tree, "cudaGraphLaunch")
    eager = named(tree, "cudaLaunchKernel")
    decode = np.array(tree.steps.kind)[np.maximum(tree.step, 0)] == "decode"
    decode &= tree.step >= 0
    w = in_window(tree)
    assert (graph & decode & w & (tree.rank == 3)).sum() == 0
    assert (eager & decode & w & (tree.rank == 3)).sum() > 100
    assert (graph & decode & w & (tree.rank == 0)).sum() > 0
    assert (graph & decode & outside_window(tree) & (tree.rank == 3)).sum() > 0
    # labelled: the window's steps that would have replayed a graph; its prefills ran as before
    kind = np.array(tree.steps.kind)
    rank3 = tree.steps.rank == 3
    index = tree.steps.index
    window_steps = rank3 & (index >= WINDOW[0]) & (index < WINDOW[1])
    replayed = set(index[window_steps & (kind == "decode")].tolist())
    assert set(CaseLabels.read(out).steps) == replayed
    # its peers still meet it at every collective: the instances stay joined across all four
    sizes = np.bincount(np.bincount(tree.comm.instance))
    assert sizes.nonzero()[0].tolist() == [4]


def test_scheduler_misconfig_shrinks_batches_inside_the_window():
    _, _, tree = case(fault="scheduler_misconfig", rank=0)
    s = tree.steps
    tokens = s.context_tokens + s.generation_tokens
    w = (s.index >= WINDOW[0]) & (s.index < WINDOW[1])
    assert tokens[w].max() <= 2048 // 4
    assert tokens[~w].max() > 2048 // 4


def test_scheduler_misconfig_labels_only_the_steps_its_limits_held_work_back():
    """A smaller budget changes nothing in a step whose work fits under it: the labelled steps
    are the window's steps where, by the ground truth, a request that had arrived still waited
    for its first chunk or the step ran a full (shrunk) token budget; every other window step
    is left out."""
    out, _, _ = case(fault="scheduler_misconfig", rank=0, initial=4, rate=300.0, output_median=16)
    truth = out / "ground_truth"
    steps = [json.loads(line) for line in (truth / "steps.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("replica", 0) == 0]
    arrival = {}
    for line in (truth / "requests.jsonl").read_text().splitlines():
        request = json.loads(line)
        arrival[request["request_id"]] = request["arrival_ns"]
    first_step: dict[str, int] = {}
    for s in steps:
        for r in s["requests"]:
            if r["phase"] == "prefill":
                first_step.setdefault(r["request_id"], s["step"])
    budget = 2048 // 4  # intensity 1: limits shrink by 1/(1 + 3)
    held = set()
    for s in steps[WINDOW[0] : WINDOW[1]]:
        waiting = any(
            t <= s["start_ns"] and first_step.get(r, STEPS) > s["step"] for r, t in arrival.items()
        )
        if waiting or sum(r["tokens"] for r in s["requests"]) >= budget:
            held.add(s["step"])
    labels = CaseLabels.read(out)
    assert set(labels.steps) == held
    assert 0 < len(held) < WINDOW[1] - WINDOW[0], sorted(held)


def test_a_scheduler_plan_is_held_back_by_lowered_limits_not_by_its_own_or_a_full_cache():
    def scheduler(configured: EngineConfig, requests: int) -> Scheduler:
        workload = WorkloadConfig(initial_requests=requests, prompt_sigma=0.0, rate_per_s=1e-3)
        return Scheduler(configured, workload, np.random.default_rng(0), 0, 0)

    def plan(configured: EngineConfig, requests: int, **lowered: int):
        planner = scheduler(configured, requests)
        planner.engine = dataclasses.replace(configured, **lowered)
        return planner.plan(0, 0)

    assert not plan(EngineConfig(), 2).held_back  # two 512-token prompts fit a 2048 budget
    # a prompt cut in chunks by a lowered budget
    assert plan(EngineConfig(), 1, max_num_batched_tokens=256).held_back
    assert plan(EngineConfig(), 4, max_num_seqs=2).held_back  # two wait for a seat
    # the engine's own limits binding are its configuration, not the fault
    assert not plan(EngineConfig(max_num_batched_tokens=256), 1).held_back
    assert not plan(EngineConfig(max_num_seqs=2), 4).held_back
    # lowered once the engine had filled its own seats: the two waiting had no seat anyway
    configured = EngineConfig(max_num_seqs=2)
    saturated = scheduler(configured, 4)
    assert len(saturated.plan(0, 0).prefill) == 2
    saturated.engine = dataclasses.replace(configured, max_num_seqs=1)
    assert not saturated.plan(1, 0).held_back
    # a cache too small for a third prompt leaves it waiting with budget and seats to spare
    full = plan(EngineConfig(kv_blocks=80), 4)
    assert len(full.prefill) == 2 and not full.held_back


def test_collective_hang_leaves_peers_in_the_collective_until_the_watchdog():
    out, _, tree = case(fault="collective_hang", rank=1)
    comm = tree.comm
    counts = np.bincount(comm.rank, minlength=4)
    assert counts[0] == counts[2] == counts[3] > counts[1]
    without_guilty = sorted(
        i for i in range(comm.num_instances) if 1 not in comm.rank[comm.instance == i].tolist()
    )
    # the peers' hosts enqueued the step's collectives; the first never completes on any GPU
    starts, ends = comm_kernel_times(tree)
    hung = [i for i in without_guilty if i in starts]
    assert len(hung) == 1 and sorted(starts[hung[0]]) == [0, 2, 3]
    waits = [ends[hung[0]][r] - starts[hung[0]][r] for r in (0, 2, 3)]
    assert min(waits) >= 600 * 10**9  # PyTorch's default NCCL timeout
    log = (out / "logs" / "server0.log").read_text()
    for r in (0, 2, 3):
        assert f"[rank{r}]:[E" in log and "Timeout at NCCL work" in log
    assert "[rank1]:" not in log
    # the watchdog names the hung all-reduce's element count, as its record_param_comms has it
    seq = int(re.search(r"Timeout at NCCL work: (\d+)", log).group(1))
    with gzip.open(out / "traces" / "rank0.pt.trace.json.gz") as handle:
        events = json.load(handle)["traceEvents"]
    nelems = next(
        e["args"]["In msg nelems"]
        for e in events
        if e.get("name") == "record_param_comms"
        and e["args"]["Process Group Description"] == "tp"
        and e["args"]["Seq"] == seq
    )
    assert nelems > 0 and f"NumelIn={nelems}, NumelOut={nelems}," in log
    labels = CaseLabels.read(out)
    assert labels.steps == [WINDOW[0]] and labels.guilty_rank == 1


def test_workload_shift_brings_longer_prompts_and_is_labelled_a_control():
    out, _, _ = case(fault="workload_shift", rank=0, rate=400.0, output_median=2, steps=150)
    labels = CaseLabels.read(out)
    assert (labels.view, labels.guilty_rank, labels.guilty_operator) == ("-", None, None)
    start, end = labels.window_ns
    spans = json.loads((out / "otlp" / "spans.json").read_text())
    inside, outside = [], []
    for span in spans["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        attrs = {a["key"]: a["value"] for a in span["attributes"]}
        prompt = int(attrs["gen_ai.usage.prompt_tokens"]["intValue"])
        arrival = int(span["startTimeUnixNano"])
        (inside if start <= arrival < end else outside).append(prompt)
    assert len(inside) > 5 and len(outside) > 5
    assert np.median(inside) > 2.5 * np.median(outside)


def test_no_fault_labels_nothing():
    out, _, _ = case()
    labels = CaseLabels.read(out)
    assert (labels.fault, labels.view, labels.steps, labels.window_ns) == ("none", "-", [], None)
