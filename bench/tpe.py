"""Benchmark TPE: reduction R = 1 - tokens/nodes per step by vocabulary size, training time on
1M nodes, encoding speed, and what the residuals cost.

    .venv/bin/python bench/tpe.py                       # real, 4 generated sim, 2 recorded lab
    .venv/bin/python bench/tpe.py --lab CASE_DIR ...    # lab cases already recorded instead
    .venv/bin/python bench/tpe.py --vocab 256 4096 --sim-cases 0

Corpora:
* real: every Kineto file under TELLER_TRACES / ../shared/traces (Nsight exports are left out),
  its step slices, or one slice per root for files without steps;
* sim: cases generated with `teller lab sim` into a temp dir (when that command exists);
* lab: case directories named with --lab (`teller lab run` output), or, without --lab,
  --lab-cases short cases recorded with `teller.lab.run.run_case` into the temp dir (~40 s each).

R is reported in-sample (train on the whole corpus, encode it) and held out (two folds by run:
train on one half of the runs, encode the other), per slice (mean, median) and over all nodes.
Printed as Markdown, for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import traces_root
from teller.slices.slice import Slice
from teller.tpe import TPE
from teller.tpe.corpus import find_runs, run_slices
from teller.tpe.tokenizer import DEFAULT_WEIGHTING, WEIGHTINGS

VOCAB_SIZES = (256, 512, 1024, 2048, 4096, 8192)
#: Generated simulator cases: (fault, extra arguments). Small, varied topologies and faults.
SIM_CASES = (
    ("none", ["--tp", "4", "--gpus-per-node", "4"]),
    ("straggler", ["--tp", "4", "--gpus-per-node", "4", "--rank", "1"]),
    ("kernel_regression", ["--tp", "2", "--gpus-per-node", "2", "--rank", "0"]),
    ("gpu_throttle", ["--tp", "2", "--pp", "2", "--gpus-per-node", "4", "--rank", "2"]),
    ("workload_shift", ["--tp", "2", "--gpus-per-node", "2", "--eager"]),
    ("net_delay", ["--tp", "2", "--nodes", "2", "--gpus-per-node", "1", "--rank", "1"]),
)


@dataclass
class Run:
    name: str
    slices: list[Slice]
    group: str  # row label the run's slices are reported under


def timed(work):
    """Run `work()`; return its result, wall seconds and CPU seconds (the machine is shared)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def real_runs() -> list[Run]:
    root = traces_root()
    runs = []
    for files in find_runs([root]):
        if files[0].suffix == ".sqlite":
            continue
        slices = run_slices(files)
        if not slices:
            continue
        group = "real, step slices" if slices[0].kind == "step" else "real, root slices (no steps)"
        runs.append(Run(str(files[0].relative_to(root)), slices, group))
    return runs


def sim_runs(count: int, steps: int, out: Path) -> list[Run]:
    teller = [sys.executable, "-c", "from teller.cli import run; run()"]
    probe = subprocess.run([*teller, "lab", "sim", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        print("(teller lab sim not available: no simulated cases)", file=sys.stderr)
        return []
    runs = []
    for number, (fault, extra) in enumerate(SIM_CASES[:count]):
        case = out / f"sim{number}-{fault}"
        command = [*teller, "-q", "lab", "sim", "--out", str(case), "--steps", str(steps)]
        command += ["--fault", fault, "--seed", str(number + 1), "--jobs", "1", *extra]
        subprocess.run(command, check=True, capture_output=True)
        for files in find_runs([case]):
            runs.append(Run(case.name, run_slices(files), "sim"))
    return runs


#: Recorded lab cases: (fault, guilty rank). A healthy run and a slow operator, TP 2.
LAB_CASES = (("none", 0), ("slow_operator", 1), ("host_stall", 0))


def record_lab_runs(count: int, seconds: float, out: Path) -> list[Run]:
    """Record `count` short `teller lab run` cases into `out` and read them (none if the lab
    cannot run here: the reason is printed)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)  # the serving processes log to stdout; the tables must stay clean Markdown
    try:
        from teller.lab.run import CaseSpec, run_case

        paths = []
        for number, (fault, rank) in enumerate(LAB_CASES[:count]):
            window = (1.0, max(seconds - 1.0, 1.5))
            spec = CaseSpec(fault=fault, rank=rank, window_s=window, tp=2, seed=number + 1)
            spec.duration_s = seconds
            paths.append(str(run_case(spec, out / f"lab{number}-{fault}").case_dir))
    except Exception as error:  # the lab needs a serving stack; the benchmark goes on without
        print(f"(teller lab run failed: {error}; no lab cases)", file=sys.stderr)
        return []
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    return lab_runs(paths)


def lab_runs(paths: list[str]) -> list[Run]:
    return [
        Run(str(files[0].parent.parent), run_slices(files), "lab") for files in find_runs(paths)
    ]


@dataclass
class Encoded:
    group: str
    nodes: int
    tokens: int

    @property
    def reduction(self) -> float:
        return 1.0 - self.tokens / self.nodes if self.nodes else 0.0


WEIGHTING = "slice"  # set from --weighting


def train(slices: list[Slice], vocab: int, cap: int | None) -> TPE:
    return TPE.train(slices, vocab, max_token_nodes=cap, weighting=WEIGHTING)


def encode_all(tpe: TPE, runs: list[Run]) -> list[Encoded]:
    return [Encoded(r.group, len(s), len(tpe.encode(s))) for r in runs for s in r.slices]


def folds(runs: list[Run]) -> list[tuple[list[Run], list[Run]]]:
    """Two folds by run; a single run is split by step parity instead (said in the output)."""
    if len(runs) >= 2:
        even, odd = runs[0::2], runs[1::2]
        return [(even, odd), (odd, even)]
    run = runs[0]
    even = Run(run.name, run.slices[0::2], run.group)
    odd = Run(run.name, run.slices[1::2], run.group)
    return [([even], [odd]), ([odd], [even])]


def summarise(rows: list[Encoded], group: str) -> str:
    mine = [r for r in rows if r.group == group]
    if not mine:
        return "– | – | –"
    per_slice = np.asarray([r.reduction for r in mine])
    overall = 1.0 - sum(r.tokens for r in mine) / sum(r.nodes for r in mine)
    return f"{per_slice.mean():.1%} | {np.median(per_slice):.1%} | {overall:.1%}"


def reduction_table(name: str, runs: list[Run], vocab_sizes: list[int], cap: int | None) -> None:
    groups = sorted({r.group for r in runs})
    slices = [s for r in runs for s in r.slices]
    nodes = sum(len(s) for s in slices)
    split = "by run" if len(runs) >= 2 else "by step parity (one run)"
    print(f"\n### {name}: {len(runs)} runs, {len(slices):,} slices, {nodes:,} nodes")
    capped = f"; at most {cap} nodes per token" if cap else ""
    print(f"held out = two folds {split}; R per slice mean | median | over all nodes{capped}\n")
    print(
        "| group | vocab | kinds | merges | in-sample mean | median | all nodes "
        "| held-out mean | median | all nodes | train CPU s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for vocab in vocab_sizes:
        tpe, _, train_s = timed(lambda v=vocab: train(slices, v, cap))
        in_sample = encode_all(tpe, runs)
        held_out: list[Encoded] = []
        for fit, test in folds(runs):
            fold_tpe = train([s for r in fit for s in r.slices], vocab, cap)
            held_out.extend(encode_all(fold_tpe, test))
        for group in groups:
            print(
                f"| {group} | {vocab} | {len(tpe.base)} | {len(tpe.merges)} | "
                f"{summarise(in_sample, group)} | {summarise(held_out, group)} | {train_s:.1f} |",
                flush=True,
            )


def speed(runs: list[Run], target_nodes: int, vocab: int) -> None:
    base = [s for r in runs for s in r.slices]
    base_nodes = sum(len(s) for s in base)
    copies = max(1, -(-target_nodes // base_nodes))
    corpus = base * copies
    nodes = base_nodes * copies
    print(f"\n### Speed: {nodes:,} nodes ({len(base):,} slices of all corpora above × {copies})\n")
    tpe, train_wall, train_s = timed(lambda: train(corpus, vocab, None))
    encoded, encode_wall, encode_s = timed(lambda: [tpe.encode(s) for s in base])
    decoded, decode_wall, decode_s = timed(lambda: [tpe.decode(t) for t in encoded])
    exact = all(d == s for d, s in zip(decoded, base, strict=True))
    tokens = sum(len(t) for t in encoded)
    residual = sum(t.residual_bytes() for t in encoded)
    provenance = sum(t.tree_node.nbytes for t in encoded)
    token_bytes = sum(
        t.kind.nbytes
        + t.parent.nbytes
        + t.slot.nbytes
        + t.edge.nbytes
        + t.depth.nbytes
        + t.start_ns.nbytes
        + t.dur_ns.nbytes
        + t.offsets.nbytes
        for t in encoded
    )
    print("| measure | value |")
    print("|---|---:|")
    print(
        f"| training, vocab {vocab} ({len(tpe.merges):,} merges) | {train_s:.1f} s CPU, "
        f"{train_wall:.1f} s wall ({nodes / train_s:,.0f} nodes per CPU s) |"
    )
    print(
        f"| encoding ({base_nodes:,} nodes) | {encode_s:.1f} s CPU, {encode_wall:.1f} s wall "
        f"({base_nodes / encode_s:,.0f} nodes per CPU s) |"
    )
    print(
        f"| decoding | {decode_s:.1f} s CPU, {decode_wall:.1f} s wall "
        f"({base_nodes / decode_s:,.0f} nodes per CPU s); exact: {exact} |"
    )
    print(
        f"| tokens / nodes | {tokens:,} / {base_nodes:,} (R over all nodes {1 - tokens / base_nodes:.1%}) |"
    )
    print(f"| token columns | {token_bytes / max(tokens, 1):.1f} bytes/token |")
    print(
        f"| residuals (position, name id, rank, stream, start, dur, self; names table) | "
        f"{residual / base_nodes:.1f} bytes/node |"
    )
    print(f"| provenance (tree node id, optional) | {provenance / base_nodes:.1f} bytes/node |")
    print(f"| vocabulary JSON | {len(__import__('json').dumps(tpe.to_json())):,} bytes |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=list(VOCAB_SIZES))
    parser.add_argument("--sim-cases", type=int, default=4, help="simulated cases to generate")
    parser.add_argument("--sim-steps", type=int, default=24, help="engine steps per sim case")
    parser.add_argument("--lab", nargs="*", default=[], help="lab case directories to read")
    parser.add_argument(
        "--lab-cases", type=int, default=2, help="lab cases to record when --lab is not given"
    )
    parser.add_argument("--lab-seconds", type=float, default=4.0, help="seconds per lab case")
    parser.add_argument(
        "--weighting",
        choices=WEIGHTINGS,
        default=DEFAULT_WEIGHTING,
        help="merge selection: mean R per slice or tokens saved over all nodes",
    )
    parser.add_argument("--speed-nodes", type=int, default=1_000_000, help="0 skips the speed run")
    parser.add_argument("--speed-vocab", type=int, default=8192)
    parser.add_argument("--max-token-nodes", type=int, help="cap on nodes per token (default none)")
    args = parser.parse_args()
    global WEIGHTING
    WEIGHTING = args.weighting
    load = os.getloadavg()
    print(
        f"bench/tpe.py on {platform.node()}: {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, weighting {WEIGHTING}"
    )
    corpora: list[tuple[str, list[Run]]] = [("Real traces", real_runs())]
    with tempfile.TemporaryDirectory(prefix="teller-bench-tpe-") as tmp:
        if args.sim_cases:
            sim = sim_runs(args.sim_cases, args.sim_steps, Path(tmp))
            if sim:
                corpora.append(("Simulated cases (teller lab sim)", sim))
        lab = lab_runs(args.lab) if args.lab else []
        if not args.lab and args.lab_cases:
            lab = record_lab_runs(args.lab_cases, args.lab_seconds, Path(tmp))
        if lab:
            corpora.append(("Lab cases (teller lab run)", lab))
        for name, runs in corpora:
            reduction_table(name, runs, args.vocab, args.max_token_nodes)
        if args.speed_nodes:
            speed([r for _, runs in corpora for r in runs], args.speed_nodes, args.speed_vocab)


if __name__ == "__main__":
    main()
