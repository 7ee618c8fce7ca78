"""Mutation fuzzing of every reader over real traces, an engine log and OTLP spans.

Each test writes seeded hostile variants (tests/fuzz/mutations.py) and reads them the way the
CLI does (a Kineto or nsys trace all the way to its call tree). Only a table or a TellerError may
come back; any other exception or a variant past the time limit is a crash. The default run reads
a few hundred variants; `-m slow` adds the full run of more than a thousand, with its own seeds.
Counts per run are printed (`-s`) for docs/reliability.md.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from conftest import real_trace
from fuzz.harness import Tally
from fuzz.mutations import KinetoMutator, LogMutator, SpanMutator, kineto_seed, mutate_sqlite
from fuzz.seeds import KINETO_SEEDS, NSYS_SEEDS, VLLM_LOG, span_export
from teller.callchain.tree import build_tree
from teller.ingest import read_trace
from teller.ingest.logs import read_logs
from teller.ingest.otlp import read_spans

#: Variants per reader in the default run and in the full (slow) run; seeds differ between runs.
DEFAULT = {"kineto": 150, "nsys": 40, "logs": 80, "spans": 60}
FULL = {"kineto": 700, "nsys": 150, "logs": 300, "spans": 200}
RUNS = [
    pytest.param("default", DEFAULT, 1, id="default"),
    pytest.param("full", FULL, 1_000_003, id="full", marks=pytest.mark.slow),
]


def _check_trace(events) -> None:
    """What a read trace must hold whatever its input: no negative durations (a value past int64
    wrapped), and a call tree that builds."""
    dur = events.table.column("dur_ns").to_numpy()
    assert (dur >= 0).all(), "a duration wrapped to a negative value"
    build_tree(events)


@pytest.mark.parametrize(("run", "counts", "seed"), RUNS)
def test_kineto_variants_read_or_fail_clearly(run, counts, seed, tmp_path: Path) -> None:
    mutators = [
        KinetoMutator(kineto_seed(real_trace(name)), Path(name).name.split(".")[0])
        for name in KINETO_SEEDS
    ]
    rng = random.Random(seed)
    tally = Tally()
    for index in range(counts["kineto"]):
        variant = rng.choice(mutators).variant(rng)
        path = tmp_path / f"{index}-{variant.name}"
        path.write_bytes(variant.data)
        tally.run(
            f"kineto #{index} {variant.operator}", lambda path=path: _check_trace(read_trace(path))
        )
        path.unlink()
    print(f"kineto ({run}): {tally.summary()}")
    assert not tally.crashes, tally.summary()
    assert tally.read and tally.refused  # the variants exercise both outcomes


@pytest.mark.parametrize(("run", "counts", "seed"), RUNS)
def test_nsys_variants_read_or_fail_clearly(run, counts, seed, tmp_path: Path) -> None:
    seeds = [real_trace(name) for name in NSYS_SEEDS]
    rng = random.Random(seed)
    tally = Tally()
    for index in range(counts["nsys"]):
        path = tmp_path / f"{index}.sqlite"
        operator = mutate_sqlite(rng.choice(seeds), path, rng)
        tally.run(f"nsys #{index} {operator}", lambda path=path: _check_trace(read_trace(path)))
        path.unlink()
    print(f"nsys ({run}): {tally.summary()}")
    assert not tally.crashes, tally.summary()
    assert tally.read


@pytest.mark.parametrize(("run", "counts", "seed"), RUNS)
def test_log_variants_read_or_fail_clearly(run, counts, seed, tmp_path: Path) -> None:
    mutator = LogMutator(VLLM_LOG, "rank0")
    rng = random.Random(seed)
    tally = Tally()
    for index in range(counts["logs"]):
        variant = mutator.variant(rng)
        folder = tmp_path / str(index)
        folder.mkdir()
        path = folder / variant.name
        path.write_bytes(variant.data)

        def read(path: Path = path) -> None:
            logs = read_logs([path])
            ts = logs.table.column("ts_ns").to_numpy()
            assert ((ts >= 0) | (ts == -1)).all(), "a log time wrapped past int64"

        tally.run(f"logs #{index} {variant.operator}", read)
    print(f"logs ({run}): {tally.summary()}")
    assert not tally.crashes, tally.summary()
    assert tally.read


@pytest.mark.parametrize(("run", "counts", "seed"), RUNS)
def test_span_variants_read_or_fail_clearly(run, counts, seed, tmp_path: Path) -> None:
    mutator = SpanMutator(span_export(), "spans")
    rng = random.Random(seed)
    tally = Tally()
    for index in range(counts["spans"]):
        variant = mutator.variant(rng)
        path = tmp_path / f"{index}-{variant.name}"
        path.write_bytes(variant.data)

        def read(path: Path = path) -> None:
            requests = read_spans([path])
            arrival = np.asarray(requests.column("arrival_ns"), dtype=np.int64)
            assert (arrival > 0).all()

        tally.run(f"spans #{index} {variant.operator}", read)
    print(f"spans ({run}): {tally.summary()}")
    assert not tally.crashes, tally.summary()
    assert tally.read and tally.refused
