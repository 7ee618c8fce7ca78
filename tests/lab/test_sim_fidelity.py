"""Structural fidelity: simulated traces against the real ones they were calibrated from.

teller's reader and tree builder must not be able to tell them apart by structure. Compared on the
decoder layers of the real H100 Hugging Face trace (24 layers) and of eager steps of a simulated
single-GPU case, with these tolerances:

* layer proportions (share of python / cpu_op / runtime / kernel / memset nodes): within 0.03;
* kernels per decoder layer: equal medians, and a CUDA-graph decode step replays the same number;
* tree depth below the decoder-layer node: total-variation distance at most 0.05;
* launch-to-kernel delay on an idle stream: median within a factor of 2 of the real one;
* vLLM's frames from the step annotation down to the graph replay, in the real order.

A second engine's real step, SGLang's Qwen3-8B prefill (calibration's `serving_step`), holds the
step level to what does not depend on the framework or the GPU:

* the step annotation for SGLang's batch (15 sequences, 15360 tokens): the same string;
* decoder layers in a step: siblings under one model frame, in index order, each launching the same
  number of kernels; kernels outside the layers: share of the step's within 0.05 of SGLang's.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import real_trace
from lab.test_sim_cases import case
from teller.callchain.tree import EDGE_LAUNCH, CallTree, build_tree
from teller.ingest import read_trace
from teller.ingest.schema import LAYER_CODE
from teller.lab.sim.calibration import load
from teller.lab.sim.engine import Request, StepPlan

DECODER_LAYER = re.compile(r"^nn\.Module: \w+DecoderLayer_\d+$")
COMPARED_LAYERS = ("python", "cpu_op", "runtime", "kernel", "memset")


@pytest.fixture(scope="module")
def real() -> CallTree:
    return build_tree(read_trace(real_trace("tracelens/hf_qwen1.5-0.5b_h100.json.gz")))


@pytest.fixture(scope="module")
def simulated() -> CallTree:
    return case(gpus=1, tp=1, rank=0, python=True, layers=3, steps=30)[2]


def decoder_layers(tree: CallTree) -> list[int]:
    return [i for i in range(len(tree)) if DECODER_LAYER.match(tree.node_name(i))]


def subtree(tree: CallTree, root: int) -> list[int]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(tree.children(node).tolist())
    return out


def eager_layers(tree: CallTree) -> list[int]:
    kinds = tree.steps.kind
    return [
        n for n in decoder_layers(tree) if tree.step[n] >= 0 and kinds[tree.step[n]] != "decode"
    ]


def layer_shares(tree: CallTree, roots: list[int]) -> dict[str, float]:
    nodes = np.concatenate([subtree(tree, r) for r in roots])
    codes = tree.layer[nodes]
    total = np.isin(codes, [LAYER_CODE[x] for x in COMPARED_LAYERS]).sum()
    return {x: float((codes == LAYER_CODE[x]).sum() / total) for x in COMPARED_LAYERS}


def test_layer_proportions_match(real, simulated):
    real_shares = layer_shares(real, decoder_layers(real))
    sim_shares = layer_shares(simulated, eager_layers(simulated))
    for layer in COMPARED_LAYERS:
        assert abs(real_shares[layer] - sim_shares[layer]) <= 0.03, (layer, real_shares, sim_shares)


def kernels_in(tree: CallTree, root: int) -> int:
    nodes = np.array(subtree(tree, root))
    return int((tree.layer[nodes] == LAYER_CODE["kernel"]).sum())


def test_kernels_per_layer_match_and_graph_replays_keep_them(real, simulated):
    real_count = np.median([kernels_in(real, n) for n in decoder_layers(real)])
    sim_counts = [kernels_in(simulated, n) for n in eager_layers(simulated)]
    assert sim_counts and np.median(sim_counts) == real_count
    steps = simulated.steps
    decode = [k for k in range(len(steps)) if steps.kind[k] == "decode"]
    assert decode, "the case has CUDA-graph decode steps"
    nodes = np.array(subtree(simulated, int(steps.node[decode[0]])))
    kernels = (simulated.layer[nodes] == LAYER_CODE["kernel"]).sum()
    assert kernels == 3 * real_count  # three layers, every kernel replayed by the graphs


def depth_histogram(tree: CallTree, roots: list[int]) -> np.ndarray:
    depths = np.concatenate([tree.depth[subtree(tree, r)] - tree.depth[r] for r in roots])
    cpu = np.concatenate([tree.stream[subtree(tree, r)] < 0 for r in roots])
    counts = np.bincount(depths[cpu], minlength=40)[:40]
    return counts / counts.sum()


def test_tree_depth_distribution_matches(real, simulated):
    distance = (
        0.5
        * np.abs(
            depth_histogram(real, decoder_layers(real))
            - depth_histogram(simulated, eager_layers(simulated))
        ).sum()
    )
    assert distance <= 0.05


def idle_launch_delays(tree: CallTree) -> np.ndarray:
    """Kernel start minus launch start, for launches that found their stream idle."""
    gpu = np.flatnonzero((tree.edge == EDGE_LAUNCH) & (tree.stream >= 0))
    gpu = gpu[np.lexsort((tree.start[gpu], tree.stream[gpu], tree.rank[gpu]))]
    delays, previous_end = [], {}
    for node in gpu.tolist():
        key = (int(tree.rank[node]), int(tree.stream[node]))
        launcher = int(tree.parent[node])
        if previous_end.get(key, 0) <= tree.start[launcher] < tree.start[node]:
            delays.append(int(tree.start[node] - tree.start[launcher]))
        previous_end[key] = int(tree.start[node] + tree.dur[node])
    return np.array(delays)


def test_launch_to_kernel_delays_match(real, simulated):
    real_delay = np.median(idle_launch_delays(real))
    sim_delays = idle_launch_delays(simulated)
    assert len(sim_delays) > 50
    assert 0.5 <= np.median(sim_delays) / real_delay <= 2.0


def test_vllm_frames_lead_from_the_step_to_the_graph_replay(simulated):
    launch = next(i for i in range(len(simulated)) if simulated.node_name(i) == "cudaGraphLaunch")
    chain = []
    node = int(simulated.parent[launch])
    while node >= 0:
        chain.append(simulated.node_name(node))
        node = int(simulated.parent[node])
    vllm = load().vllm
    expected = list(reversed(vllm["graph_replay"]))
    assert chain[: len(expected)] == expected
    top = chain[::-1]
    assert (
        top[0].startswith("execute_")
        and simulated.layer_name(node_of(simulated, top[0])) == "engine"
    )
    steps_frames = vllm["step_to_model"]
    assert top[1 : 1 + len(steps_frames)] == steps_frames
    assert top[1 + len(steps_frames)] == load().model["model_module"]


def node_of(tree: CallTree, name: str) -> int:
    return next(i for i in range(len(tree)) if tree.node_name(i) == name)


def test_step_annotation_matches_a_real_sglang_step():
    """SGLang's prefill of 15 sequences, 15360 tokens (its own `step[EXTEND bs=15 toks=15360]`)
    carries vLLM's step annotation; the simulator writes the same string for that batch: first
    prefills of equal length, which is what the real sqsq = 15 · 1024² says."""
    reference = load().raw["serving_step"]
    batch = re.search(r"bs=(\d+) toks=(\d+)", reference["engine_annotation"])
    sequences, tokens = int(batch.group(1)), int(batch.group(2))
    prompt = tokens // sequences
    requests = [Request(i, f"r{i}", 0, prompt, 1) for i in range(sequences)]
    plan = StepPlan(0, 0, prefill=[(r, prompt, 0) for r in requests], decode=[])
    assert plan.annotation() == reference["annotation"]


def test_decoder_layers_in_a_step_are_arranged_as_in_a_real_sglang_step(simulated):
    reference = load().raw["serving_step"]
    assert reference["layers_share_parent"] and len(reference["kernels_per_layer"]) == 1
    real_outside = reference["kernels_outside_layers"] / reference["kernels"]
    steps = simulated.steps
    eager = [k for k in range(len(steps)) if steps.kind[k] != "decode" and steps.rank[k] == 0]
    assert eager
    for k in eager:
        nodes = np.array(subtree(simulated, int(steps.node[k])))
        layers = sorted(
            (n for n in nodes.tolist() if DECODER_LAYER.match(simulated.node_name(n))),
            key=lambda n: simulated.start[n],
        )
        assert len(layers) == 3
        assert len({int(simulated.parent[n]) for n in layers}) == 1
        index = [int(simulated.node_name(n).rsplit("_", 1)[1]) for n in layers]
        assert index == sorted(index)
        per_layer = [kernels_in(simulated, n) for n in layers]
        assert len(set(per_layer)) == 1
        in_step = int((simulated.layer[nodes] == LAYER_CODE["kernel"]).sum())
        assert abs((in_step - sum(per_layer)) / in_step - real_outside) <= 0.05
