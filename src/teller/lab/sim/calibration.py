"""The calibration table (calibration.json, made by scripts/calibrate_sim.py from real traces).

The simulator types in no kernel name, stack shape or duration: it reads them from here. The
decoder-layer template is replayed node for node; kernel durations are drawn from per-kernel
log-normal fits and scaled by the tokens a step computes relative to the profiled batch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

CALIBRATION_PATH = Path(__file__).with_name("calibration.json")
_MODULE = re.compile(r"^(nn\.Module: \w+?)_(\d+)$")


@dataclass(frozen=True)
class Fit:
    """A log-normal duration fit: ln(dur_ns) ~ N(log_mu, log_sigma)."""

    log_mu: float
    log_sigma: float
    median_ns: int

    @classmethod
    def of(cls, entry: dict) -> Fit:
        return cls(float(entry["log_mu"]), float(entry["log_sigma"]), int(entry["median_ns"]))

    def sample(self, rng: np.random.Generator) -> float:
        return math.exp(self.log_mu + self.log_sigma * rng.standard_normal())


@dataclass(frozen=True)
class TemplateNode:
    name: str
    layer: str  # python | cpu_op | runtime | kernel | memset | memcpy
    parent: int  # index in the template, -1 for the layer root
    start_ns: int  # relative to the layer root's start
    dur_ns: int
    bytes: int = 0


def _section(*keys: str) -> property:
    """A read-only attribute for the part of `raw` under `keys`."""

    def get(calibration: Calibration):
        value = calibration.raw
        for key in keys:
            value = value[key]
        return value

    return property(get)


@dataclass(frozen=True)
class Calibration:
    raw: dict
    nodes: tuple[TemplateNode, ...]
    reference_tokens: int
    kernel_floor_ns: int
    kernels: dict[str, Fit]
    launch_delay: Fit
    runtime: dict[str, Fit]
    cpu_log_sigma: float
    modules_per_layer: dict[str, int]

    def launch_args(self, kernel: str) -> dict:
        """CUPTI's measured launch arguments of a kernel (grid, block, registers, …), if known."""
        entry = self.raw["kernels"].get(kernel)
        return entry.get("launch_args", {}) if entry else {}

    #: Sections of the raw table, read as they are: the model's facts, vLLM's frames, the
    #: all-reduce, point-to-point and CUDA-graph facts, and the traces the table was made from.
    model = _section("model")
    vllm = _section("vllm")
    comm = _section("comm")
    p2p = _section("p2p_and_graphs")
    inputs = _section("meta", "inputs")

    def gemm_fallback(self) -> str | None:
        """Another real GEMM kernel than the template's (kernel_regression swaps to it)."""
        gemms = [n for n in self.kernels if "gemm" in n.lower()]
        used = {n.name for n in self.nodes if n.layer == "kernel"}
        others = [n for n in gemms if n not in used]
        return others[0] if others else None


def module_name(name: str, layer_index: int, counts: dict[str, int]) -> str:
    """`nn.Module: Linear_3` of layer 0 becomes `Linear_{3 + 7·layer}` (7 Linear per layer)."""
    match = _MODULE.match(name)
    if not match:
        return name
    kind = match.group(1).removeprefix("nn.Module: ")
    return f"{match.group(1)}_{int(match.group(2)) + layer_index * counts.get(kind, 0)}"


@cache
def load(path: str | None = None) -> Calibration:
    raw = json.loads(Path(path or CALIBRATION_PATH).read_text())
    entries = raw["layer"]["nodes"]
    starts: list[int] = []
    nodes = []
    for entry in entries:
        parent = int(entry["parent"])
        start = starts[parent] + int(entry["offset_ns"]) if parent >= 0 else 0
        starts.append(start)
        nodes.append(
            TemplateNode(
                entry["name"],
                entry["layer"],
                parent,
                start,
                int(entry["dur_ns"]),
                int(entry.get("bytes", 0)),
            )
        )
    return Calibration(
        raw=raw,
        nodes=tuple(nodes),
        reference_tokens=int(raw["reference_tokens"]),
        kernel_floor_ns=int(raw["kernel_floor_ns"]),
        kernels={name: Fit.of(v) for name, v in raw["kernels"].items()},
        launch_delay=Fit.of(raw["launch_delay"]),
        runtime={name: Fit.of(v) for name, v in raw["runtime"].items()},
        cpu_log_sigma=float(raw["layer"]["cpu_log_sigma"]),
        modules_per_layer=dict(raw["layer"]["modules_per_layer"]),
    )
