"""Record a real 2-rank gloo run under torch.profiler: `python gloo_run.py OUT_DIR`.

Run as a script by the clock tests (a subprocess, so the test process never initialises
torch.distributed). Each rank writes OUT_DIR/rank{R}.json; one intra-op thread per rank keeps the
two ranks from fighting over the two cores of a small machine. The ranks meet through a file
in OUT_DIR, not a TCP port: a probed free port can be taken by another test before gloo binds it.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

ITERATIONS = 100


def worker(rank: int, world_size: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    rendezvous = f"file://{os.path.join(os.path.abspath(out_dir), 'rendezvous')}"
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world_size)
    tensor = torch.ones(16)
    for _ in range(3):  # connections set up before profiling
        dist.all_reduce(tensor)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(ITERATIONS):
            dist.all_reduce(tensor)
            dist.broadcast(tensor, 0)
    profiler.export_chrome_trace(os.path.join(out_dir, f"rank{rank}.json"))
    # both traces written before either rank tears gloo down: a rank that destroyed its group
    # while its peer was still exporting aborted once in a full-suite run ("terminate called
    # without an active exception", SIGABRT in process 0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
