"""Record a real 2-rank gloo run under torch.profiler: `python gloo_run.py OUT_DIR`.

Run as a script by the clock tests (a subprocess, so the test process never initialises
torch.distributed). Each rank writes OUT_DIR/rank{R}.json; one intra-op thread per rank keeps the
two ranks from fighting over the two cores of a small machine. The ranks meet through a file
in OUT_DIR, not a TCP port: a probed free port can be taken by another test before gloo binds it.
"""

from __future__ import annotations

import gc
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
    dist.barrier()
    dist.destroy_process_group()
    # the profiled gloo work sits in reference cycles; left to the interpreter's final collection,
    # freeing it wakes gloo's run-loop threads after they may no longer take the GIL, and one is
    # killed mid-unwind: "terminate called without an active exception", SIGABRT (gdb: thread
    # pt_gloo_runloop under Py_FinalizeEx; CI stop 14 failed on it). Collect while the
    # interpreter lives.
    gc.collect()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
