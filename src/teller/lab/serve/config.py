"""Settings of one serving run, as one JSON-serialisable dataclass shared by launcher and ranks.

The launcher writes it to `DIR/run/serve.json`; every rank process reads the same file, so the
model, the workload and any in-process fault are configured in exactly one place.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class ModelConfig:
    """A small Llama: big enough that operators take measurable CPU time, small enough to be quick."""

    vocab_size: int = 4096
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_hidden_layers: int = 4
    # 12 heads of 32 dims: divisible by every TP size the lab runs (2, 3, 4), so each rank holds
    # whole heads (a head split across ranks breaks the forward)
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    max_position_embeddings: int = 4096
    attn_implementation: str = "sdpa"
    hidden_act: str = "silu"
    weight_seed: int = 0


@dataclass
class WorkloadConfig:
    """Poisson arrivals with uniform prompt/output lengths; an optional burst of long prompts."""

    rate_per_s: float = 6.0
    duration_s: float = 12.0  # arrivals stop after this; the engine then drains
    prompt_tokens_min: int = 16
    prompt_tokens_max: int = 128
    output_tokens_min: int = 8
    output_tokens_max: int = 32
    seed: int = 0
    # workload_shift: extra long-prompt requests arriving inside [burst_start_s, burst_end_s)
    burst_start_s: float | None = None
    burst_end_s: float | None = None
    burst_rate_per_s: float = 0.0
    burst_prompt_tokens: int = 512


@dataclass
class SchedulerConfig:
    """vLLM-like limits: at most `max_num_seqs` running requests and a per-step token budget."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    stats_interval_s: float = 2.0


@dataclass
class InProcessFault:
    """A fault the rank process makes itself, by configuration, inside a window of serve seconds.

    kind: "slow_operator" (attention implementation switched on `rank`), "host_stall" (a thread
    forcing gc.collect() storms on `rank`), "scheduler_misconfig" (tiny batch and token budget).
    """

    kind: str
    rank: int
    start_s: float
    end_s: float
    intensity: float = 1.0
    params: dict = field(default_factory=dict)

    def active(self, serve_s: float) -> bool:
        return self.start_s <= serve_s < self.end_s


@dataclass
class ServeConfig:
    """Everything one serving run needs; `run_dir` receives pid files, t0 and ground truth."""

    run_dir: str
    tp: int = 2
    model: ModelConfig = field(default_factory=ModelConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    fault: InProcessFault | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 29510
    # per-rank network namespace, socket interface and core; empty = shared loopback, no pinning
    netns: list[str] = field(default_factory=list)
    ifnames: list[str] = field(default_factory=list)
    cores: list[int] = field(default_factory=list)
    # per rank, the cgroup.procs files the launcher puts the rank into before it starts
    # (memory_pressure, straggler), so everything it allocates is charged to its own group
    cgroup_procs: list[list[str]] = field(default_factory=list)
    threads_per_rank: int = 1
    warmup_steps: int = 3
    # the engine's HTTP endpoints on rank 0 (/metrics, /start_profile, /stop_profile), as vLLM
    # serves them; None serves none (a run under the collector is profiled from outside)
    http_host: str = "127.0.0.1"
    http_port: int | None = None
    # where /start_profile ... /stop_profile writes each rank's trace (vLLM's
    # VLLM_TORCH_PROFILER_DIR); empty: the profiler endpoints answer 404
    profile_dir: str = ""
    served_model_name: str = "teller-lab/llama-tiny"

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, path: str | Path) -> ServeConfig:
        data = json.loads(Path(path).read_text())
        fault = data.pop("fault", None)
        return cls(
            model=ModelConfig(**data.pop("model")),
            workload=WorkloadConfig(**data.pop("workload")),
            scheduler=SchedulerConfig(**data.pop("scheduler")),
            fault=InProcessFault(**fault) if fault else None,
            **data,
        )
