"""Derive the simulator's calibration table from real traces (writes src/teller/lab/sim/calibration.json).

Everything the simulator says about kernels, call stacks and timing comes from here, measured with
teller's own reader and tree builder on the real files under ../shared/traces:

* the decoder-layer template: the complete call-chain subtree of the first decoder layer of the
  H100 Hugging Face Qwen trace (python frames, cpu_ops, runtime calls, the kernels and memsets they
  launch, with their real relative offsets and durations);
* kernel duration distributions: a log-normal fit per kernel name over every layer of that trace,
  with the token count of the profiled batch as the reference for scaling;
* launch-to-kernel delays: a log-normal fit over launches that found their stream idle;
* the per-layer CPU timing spread (log-std of the decoder layer's duration across layers);
* vLLM's frames above the model and around a CUDA-graph replay (vLLM piecewise trace);
* the collective's host chain (c10d op → record_param_comms → nccl:… → launch) and NCCL kernel
  names and durations (HTA distributed traces), and CUDA-graph launch call durations;
* the CUDA stream ids CUPTI gave the compute kernels (H100 trace) and the NCCL kernels: c10d runs
  each communicator on its own stream (the all-reduce trace's, and the p2p trace's per-peer
  send/recv streams in order of first use);
* a second serving engine's step as a reference the fidelity tests hold the simulator to
  (`serving_step`, from the SGLang Qwen3-8B prefill step): its vLLM-shape step annotation and
  SGLang's own `step[EXTEND bs=… toks=…]` (the simulator must write the same annotation for that
  batch), and step-level structure that does not depend on the framework: every decoder layer
  launches the same number of kernels, the layers are siblings under one model frame, and few of
  the step's kernels run outside the layers.

What the SGLang trace is not used for, and why: it was recorded on an AMD MI300X (HIP runtime)
with an 8B model, so none of its durations or launch delays describe the simulated H100 cluster;
its kernels per layer (14 fused aiter/sgl kernels) and its Python depth below the step (SGLang's
scheduler, model-runner and layer-wrapper frames; total-variation distance 0.61 from the H100
layer's depth histogram) describe SGLang's own code, not the Hugging Face eager layer the
simulator replays (42 kernels), so they are recorded as facts but not compared.

Usage: python scripts/calibrate_sim.py [--traces DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from teller.callchain.tree import EDGE_LAUNCH, CallTree, build_tree
from teller.ingest import read_trace
from teller.ingest.schema import LAYER_CODE

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "src" / "teller" / "lab" / "sim" / "calibration.json"
HF_H100 = "tracelens/hf_qwen1.5-0.5b_h100.json.gz"
VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"
NCCL_ALLREDUCE = "hta/df_index_resolver_rank1_of2_216k_events.json.gz"
NCCL_P2P_AND_GRAPHS = "hta/queue_len_rank0_of16.json.gz"
SGLANG = "tracelens/sglang_Qwen3-8B_prefilldecode.json.gz"
LAYER_MODULE = re.compile(r"^nn\.Module: (\w+DecoderLayer)_0$")
LAYER_ANY = re.compile(r"^nn\.Module: \w+DecoderLayer_\d+$")
MODEL_MODULE = re.compile(r"^nn\.Module: (\w+Model)_0$")
#: Every real trace the table is derived from (paths under the traces root), in the order read.
INPUTS = (HF_H100, VLLM, NCCL_ALLREDUCE, NCCL_P2P_AND_GRAPHS, SGLANG)
SGLANG_STEP = re.compile(r"^step\[\w+ bs=\d+ toks=\d+\]$")
#: HIP runtime names in the AMD vLLM trace map to the CUDA names of an NVIDIA cluster by prefix.
HIP_TO_CUDA = (("hip", "cuda"),)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lognormal(values_ns: np.ndarray) -> dict:
    """Log-normal fit (mean and std of ln ns) plus the median, for a sample of durations."""
    values = np.asarray(values_ns, dtype=np.float64)
    values = values[values > 0]
    logs = np.log(values)
    return {
        "count": len(values),
        "log_mu": round(float(logs.mean()), 6),
        "log_sigma": round(float(logs.std()), 6),
        "median_ns": int(np.median(values)),
    }


def cuda_name(name: str) -> str:
    for old, new in HIP_TO_CUDA:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def find(tree: CallTree, predicate) -> list[int]:
    return [i for i in range(len(tree)) if predicate(tree.names[tree.name[i]])]


def ancestors(tree: CallTree, node: int) -> list[int]:
    chain = []
    node = int(tree.parent[node])
    while node >= 0:
        chain.append(node)
        node = int(tree.parent[node])
    return chain[::-1]


def layer_template(tree: CallTree, events) -> dict:
    """The first decoder layer's subtree in preorder, offsets relative to the parent's start."""
    layers = find(tree, lambda n: LAYER_MODULE.match(n) is not None)
    root = layers[0]
    nodes: list[dict] = []
    index_of: dict[int, int] = {}
    stack = [root]
    args = events.table.column("args")
    while stack:
        node = stack.pop()
        parent = int(tree.parent[node])
        parent_index = index_of.get(parent, -1) if node != root else -1
        layer = tree.layer_name(node)
        entry = {
            "name": tree.node_name(node),
            "layer": layer,
            "parent": parent_index,
            "offset_ns": int(tree.start[node] - tree.start[parent]) if parent_index >= 0 else 0,
            "dur_ns": int(tree.dur[node]),
        }
        if layer in ("memset", "memcpy"):
            raw = args[int(tree.row[node])].as_py()
            entry["bytes"] = int(json.loads(raw).get("bytes", 0)) if raw else 0
        index_of[node] = len(nodes)
        nodes.append(entry)
        stack.extend(reversed(tree.children(node).tolist()))
    module_counts: dict[str, int] = {}
    for entry in nodes:
        match = re.match(r"^nn\.Module: (\w+)_(\d+)$", entry["name"])
        if match:
            module_counts[match.group(1)] = module_counts.get(match.group(1), 0) + 1
    every_layer = find(tree, lambda n: LAYER_ANY.match(n) is not None)
    layer_durs = tree.dur[every_layer]
    return {
        "layer_module": LAYER_MODULE.match(tree.node_name(root)).group(1),
        "layers_in_source": len(every_layer),
        "modules_per_layer": module_counts,
        "cpu_log_sigma": round(float(np.log(layer_durs).std()), 6),
        "nodes": nodes,
    }


def reference_tokens(tree: CallTree, events) -> int:
    """Tokens in the profiled batch: the embedding lookup's index tensor shape."""
    args = events.table.column("args")
    for node in find(tree, lambda n: n == "aten::embedding"):
        raw = args[int(tree.row[node])].as_py()
        dims = json.loads(raw).get("Input Dims", [])
        if len(dims) > 1 and dims[1]:
            return int(np.prod(dims[1]))
    raise SystemExit("no aten::embedding with Input Dims: cannot tell the batch's token count")


def model_facts(tree: CallTree, events) -> dict:
    """The model module above the layers, the hidden size, and the end-of-step copy back."""
    layer = find(tree, lambda n: LAYER_MODULE.match(n) is not None)[0]
    model = next(
        n for n in reversed(ancestors(tree, layer)) if MODEL_MODULE.match(tree.node_name(n))
    )
    args = events.table.column("args")
    embedding = find(tree, lambda n: n == "aten::embedding")[0]
    weight_dims = json.loads(args[int(tree.row[embedding])].as_py())["Input Dims"][0]
    copies = find(tree, lambda n: n.startswith("Memcpy DtoH"))
    launcher = int(tree.parent[copies[0]])
    kernel_streams = tree.stream[tree.layer == LAYER_CODE["kernel"]]
    return {
        "model_module": tree.node_name(model),
        "hidden_size": int(weight_dims[1]),
        "dtoh_memcpy": tree.node_name(copies[0]),
        "dtoh_runtime": tree.node_name(launcher),
        "compute_stream": int(np.bincount(kernel_streams).argmax()),
    }


def read_document(path: Path) -> dict:
    with gzip.open(path, "rb") as handle:
        return json.load(handle)


def trace_header(document: dict) -> dict:
    """The profiler's own header facts of the H100 trace (device properties, CUDA versions)."""
    keys = ("cuda_runtime_version", "cupti_version", "cuda_driver_version")
    return {key: document[key] for key in keys if key in document} | {
        "device_properties": document["deviceProperties"][0]
    }


def model_id(document: dict) -> str:
    """The profiled model's hub id, from the metadata block the H100 trace's harness wrote."""
    return str(document["metadata"]["experiment"]["repo_id"])


def runtime_cbids(*pairs) -> dict[str, int]:
    """CUPTI callback ids (`cbid`) the real traces give each CUDA runtime call."""
    out: dict[str, int] = {}
    for tree, events in pairs:
        args = events.table.column("args")
        for node in np.flatnonzero(tree.layer == LAYER_CODE["runtime"]).tolist():
            name = tree.node_name(node)
            if name in out or not name.startswith("cuda"):
                continue
            raw = args[int(tree.row[node])].as_py()
            cbid = json.loads(raw).get("cbid") if raw else None
            if cbid is not None:
                out[name] = int(cbid)
    return dict(sorted(out.items()))


#: Per-activity ids the simulator fills in itself; every other kernel argument is copied as measured.
RUNTIME_IDS = ("External id", "queued", "device", "context", "stream", "correlation")


def kernel_stats(tree: CallTree, events) -> dict:
    """Per kernel name: log-normal duration fit and the launch arguments CUPTI recorded for it
    (grid, block, registers, shared memory, occupancy), from its first occurrence."""
    gpu_layers = [LAYER_CODE["kernel"], LAYER_CODE["memset"], LAYER_CODE["memcpy"]]
    gpu = np.flatnonzero(np.isin(tree.layer, gpu_layers))
    args = events.table.column("args")
    by_name: dict[str, list[int]] = {}
    first: dict[str, int] = {}
    for node in gpu.tolist():
        name = tree.node_name(node)
        by_name.setdefault(name, []).append(int(tree.dur[node]))
        first.setdefault(name, node)
    out = {}
    for name, durs in sorted(by_name.items()):
        raw = args[int(tree.row[first[name]])].as_py()
        measured = json.loads(raw) if raw else {}
        launch = {
            k: v
            for k, v in measured.items()
            if k not in RUNTIME_IDS and k not in ("bytes", "memory bandwidth (GB/s)")
        }
        out[name] = lognormal(np.array(durs)) | {"launch_args": launch}
    return out


def launch_delays(tree: CallTree) -> np.ndarray:
    """Kernel start minus launch-call start, where the stream was idle when the call began."""
    gpu = np.flatnonzero((tree.edge == EDGE_LAUNCH) & (tree.stream >= 0))
    gpu = gpu[np.lexsort((tree.start[gpu], tree.stream[gpu]))]
    delays = []
    previous_end: dict[int, int] = {}
    for node in gpu.tolist():
        stream = int(tree.stream[node])
        launcher = int(tree.parent[node])
        idle = previous_end.get(stream, 0) <= tree.start[launcher]
        if idle and tree.start[node] > tree.start[launcher]:
            delays.append(int(tree.start[node] - tree.start[launcher]))
        previous_end[stream] = int(tree.start[node] + tree.dur[node])
    return np.array(delays)


def runtime_stats(tree: CallTree, names: set[str]) -> dict:
    out = {}
    for name in sorted(names):
        nodes = find(tree, lambda n, name=name: n == name)
        if nodes:
            out[cuda_name(name)] = lognormal(tree.dur[nodes])
    return out


def vllm_frames(tree: CallTree) -> dict:
    """vLLM's python frames: step annotation → model forward, and a piecewise graph replay."""
    launch = find(tree, lambda n: n == "hipGraphLaunch")[0]
    chain = ancestors(tree, launch)
    names = [tree.node_name(n) for n in chain]
    step_at = next(i for i, n in enumerate(names) if n.startswith("execute_"))
    model_at = next(i for i, n in enumerate(names) if MODEL_MODULE.match(n) or "ForCausalLM" in n)
    graph_at = max(i for i, n in enumerate(names) if "cuda_graph.py" in n)
    return {
        "step_to_model": names[step_at + 1 : model_at],
        "graph_replay": names[graph_at:],
        "graph_launch": cuda_name(tree.node_name(launch)),
    }


def comm_chain(tree: CallTree, events) -> dict:
    kernels = find(tree, lambda n: n.startswith("ncclKernel_AllReduce"))
    chain = ancestors(tree, kernels[0])
    comm_code = LAYER_CODE["comm"]
    outer = next(i for i, n in enumerate(chain) if tree.layer[n] == comm_code)
    host = [
        {"name": tree.node_name(n), "layer": tree.layer_name(n), "cat": _category(events, n, tree)}
        for n in chain[outer:]
    ]
    return {
        "host_chain": host,
        "kernel": tree.node_name(kernels[0]),
        "kernel_dur": lognormal(tree.dur[kernels]),
        "host_dur": lognormal(tree.dur[_outer_comm_nodes(tree)]),
        "stream": streams_by_first_use(tree, kernels)[0],
    }


def streams_by_first_use(tree: CallTree, nodes: list[int]) -> list[int]:
    """The distinct streams the GPU nodes ran on, in order of their first activity."""
    ordered = np.array(nodes)[np.argsort(tree.start[nodes], kind="stable")]
    return [int(s) for s in dict.fromkeys(tree.stream[ordered].tolist())]


def _outer_comm_nodes(tree: CallTree) -> list[int]:
    """Every collective's outermost host node (its c10d op), for the host-side duration."""
    comm_code = LAYER_CODE["comm"]
    return [
        i
        for i in range(len(tree))
        if tree.layer[i] == comm_code
        and tree.stream[i] < 0
        and (tree.parent[i] < 0 or tree.layer[tree.parent[i]] != comm_code)
    ]


def _category(events, node: int, tree: CallTree) -> str:
    return str(events.table.column("cat")[int(tree.row[node])].as_py())


def p2p_and_graphs(tree: CallTree) -> dict:
    p2p = find(tree, lambda n: n.startswith("ncclKernel_SendRecv"))
    graph = find(tree, lambda n: n == "cudaGraphLaunch")
    return {
        "p2p_kernel": tree.node_name(p2p[0]),
        "p2p_kernel_dur": lognormal(tree.dur[p2p]),
        "graph_launch_dur": lognormal(tree.dur[graph]),
        "p2p_streams": streams_by_first_use(tree, p2p),
    }


def descendants(tree: CallTree, root: int) -> np.ndarray:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(tree.children(node).tolist())
    return np.array(sorted(out))


def serving_step(tree: CallTree) -> dict:
    """Step-level facts of the SGLang trace's one (prefill) step, under its step annotation."""
    assert len(tree.steps) == 1, "the SGLang trace holds one engine step"
    step = descendants(tree, int(tree.steps.node[0]))
    names = [tree.node_name(n) for n in step.tolist()]
    layers = [int(n) for n, name in zip(step, names, strict=True) if LAYER_ANY.match(name)]
    kernel = LAYER_CODE["kernel"]
    per_layer = [int((tree.layer[descendants(tree, n)] == kernel).sum()) for n in layers]
    kernels = int((tree.layer[step] == kernel).sum())
    return {
        "annotation": tree.node_name(int(tree.steps.node[0])),
        "engine_annotation": next(name for name in names if SGLANG_STEP.match(name)),
        "decoder_layers": len(layers),
        "layers_share_parent": len({int(tree.parent[n]) for n in layers}) == 1,
        "kernels_per_layer": sorted(set(per_layer)),
        "kernels": kernels,
        "kernels_outside_layers": kernels - sum(per_layer),
    }


def depth_histogram(tree: CallTree) -> dict:
    cpu = tree.stream < 0
    depths, counts = np.unique(tree.depth[cpu], return_counts=True)
    return {int(d): int(c) for d, c in zip(depths, counts, strict=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=str(REPO.parent / "shared" / "traces"))
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    root = Path(args.traces)
    inputs = list(INPUTS)
    missing = [p for p in inputs if not (root / p).exists()]
    if missing:
        print(f"calibrate_sim: missing real traces under {root}: {missing}", file=sys.stderr)
        return 2
    trees = {}
    for rel in inputs:
        events = read_trace(root / rel)
        trees[rel] = (build_tree(events), events)
        print(f"read {rel}: {len(events):,} events", file=sys.stderr)

    hf_tree, hf_events = trees[HF_H100]
    hf_document = read_document(root / HF_H100)
    delays = launch_delays(hf_tree)
    gpu_durs = hf_tree.dur[np.isin(hf_tree.layer, [LAYER_CODE["kernel"]])]
    vllm_tree, _ = trees[VLLM]
    table = {
        "meta": {
            "command": "python scripts/calibrate_sim.py",
            "inputs": [{"path": rel, "sha256": sha256(root / rel)} for rel in inputs],
            "note": "derived by scripts/calibrate_sim.py; do not edit by hand",
        },
        "reference_tokens": reference_tokens(hf_tree, hf_events),
        "header": trace_header(hf_document),
        "model": model_facts(hf_tree, hf_events) | {"model_id": model_id(hf_document)},
        "layer": layer_template(hf_tree, hf_events),
        "kernels": kernel_stats(hf_tree, hf_events),
        "kernel_floor_ns": int(np.percentile(gpu_durs, 1)),
        "launch_delay": lognormal(delays),
        "runtime": runtime_stats(hf_tree, {"cudaLaunchKernel", "cudaLaunchKernelExC"})
        | runtime_stats(vllm_tree, {"hipGraphLaunch", "hipMemcpyAsync"}),
        "runtime_cbid": runtime_cbids(trees[HF_H100], trees[NCCL_P2P_AND_GRAPHS]),
        "vllm": vllm_frames(vllm_tree),
        "comm": comm_chain(*trees[NCCL_ALLREDUCE]),
        "p2p_and_graphs": p2p_and_graphs(trees[NCCL_P2P_AND_GRAPHS][0]),
        "real_depth_histograms": {rel: depth_histogram(trees[rel][0]) for rel in (HF_H100, VLLM)},
        "serving_step": serving_step(trees[SGLANG][0]),
    }
    out = Path(args.out)
    fd, tmp = tempfile.mkstemp(prefix=".calibration.", dir=out.parent)
    os.fchmod(fd, 0o644)  # mkstemp makes it private; the table is an ordinary source file
    with os.fdopen(fd, "w") as handle:
        json.dump(table, handle, indent=1, sort_keys=False)
        handle.write("\n")
    os.replace(tmp, out)
    size = out.stat().st_size
    print(f"wrote {out} ({size:,} bytes, {len(table['layer']['nodes'])} template nodes)")
    return 0 if math.isfinite(table["launch_delay"]["log_mu"]) else 1


if __name__ == "__main__":
    sys.exit(main())
