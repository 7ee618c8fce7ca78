"""One rank's on-demand profiler: what vLLM's workers run between `/start_profile` and `/stop_profile`.

Each capture writes `PROFILE_DIR/lab-rank-{R}.{CAPTURE}.pt.trace.json.gz`, vLLM's file shape
(`{worker}-rank-{R}.{stamp}.pt.trace.json.gz`); the rank is also in the trace's `distributedInfo`.
Beside it, `lab-rank-{R}.{CAPTURE}.host.jsonl` holds the rank's host counters over the capture,
sampled from inside the worker (`teller.collect.host.ProcessSampler`), which vLLM does not write.
The file appears by rename once complete, so whoever watches the folder never reads half a trace.
Kineto's first set-up takes seconds on a CPU host, so the profiler is prepared ahead (at start-up
and again after each export), keeping that cost out of the captured steps.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import torch

from teller.collect.host import ProcessSampler, write_samples

#: gzip level of the exported traces: export runs inside the engine loop, so favour speed.
GZIP_LEVEL = 3


def trace_name(rank: int, capture_id: str) -> str:
    return f"lab-rank-{rank}.{capture_id}.pt.trace.json.gz"


def host_name(rank: int, capture_id: str) -> str:
    """The rank's host counters over the capture (`teller.collect.host`), beside its trace."""
    return f"lab-rank-{rank}.{capture_id}.host.jsonl"


class RankProfiler:
    """torch.profiler on this rank, started and stopped by the engine core's plans."""

    def __init__(self, profile_dir: str | Path, rank: int, device: torch.device) -> None:
        self.profile_dir = Path(profile_dir)
        self.rank = rank
        self.device = device
        self.profiling = False
        self._profiler: torch.profiler.profile | None = None
        self._host: ProcessSampler | None = None
        self._prepare()

    def _prepare(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities, record_shapes=True)
        self._profiler.prepare_trace()

    def start(self) -> None:
        if self.profiling or self._profiler is None:
            return
        self._profiler.start_trace()
        self._host = ProcessSampler(os.getpid())
        self._host.start()
        self.profiling = True

    def stop(self, capture_id: str) -> Path | None:
        """Stop, export this rank's trace of the capture, and prepare for the next one."""
        if not self.profiling or self._profiler is None:
            return None
        profiler = self._profiler
        if "distributedInfo" not in getattr(profiler, "_trace_metadata", {}):
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            info = {"rank": self.rank, "world_size": world, "backend": "lab"}
            profiler.add_metadata_json("distributedInfo", json.dumps(info))
        profiler.stop()
        self.profiling = False
        if self._host is not None:  # before the trace appears: a watcher takes both together
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            write_samples(self._host.stop(), self.profile_dir / host_name(self.rank, capture_id))
            self._host = None
        path = self._export(profiler, capture_id)
        self._prepare()
        return path

    def _export(self, profiler: torch.profiler.profile, capture_id: str) -> Path:
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        final = self.profile_dir / trace_name(self.rank, capture_id)
        plain = self.profile_dir / f".{final.name}.{os.getpid()}.json.tmp"
        packed = self.profile_dir / f".{final.name}.{os.getpid()}.gz.tmp"
        try:
            profiler.export_chrome_trace(str(plain))
            with plain.open("rb") as source, gzip.open(packed, "wb", GZIP_LEVEL) as target:
                shutil.copyfileobj(source, target, 1 << 20)
            os.replace(packed, final)
        finally:
            plain.unlink(missing_ok=True)
            packed.unlink(missing_ok=True)
        return final
