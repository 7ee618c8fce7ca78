"""Hostile variants through the CLI, in-process: `teller ingest` exits 0 or 2; on 2 it prints one
error line naming the file, no traceback, and leaves no output file behind."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from conftest import real_trace
from fuzz.harness import time_limit
from fuzz.mutations import KinetoMutator, LogMutator, kineto_seed
from fuzz.seeds import KINETO_SEEDS, VLLM_LOG
from teller.cli import main

VARIANTS = 40
SEED = 7


def test_ingest_of_hostile_traces_exits_0_or_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mutators = [
        KinetoMutator(kineto_seed(real_trace(name)), Path(name).name.split(".")[0])
        for name in KINETO_SEEDS[:4]
    ]
    rng = random.Random(SEED)
    outcomes = {0: 0, 2: 0}
    for index in range(VARIANTS):
        variant = rng.choice(mutators).variant(rng)
        path = tmp_path / f"{index}-{variant.name}"
        path.write_bytes(variant.data)
        out = tmp_path / f"out{index}"
        with time_limit(20):
            status = main(["ingest", str(path), "-o", str(out)])
        err = capsys.readouterr().err
        label = f"variant {index} ({variant.operator})"
        assert status in (0, 2), label
        assert "Traceback" not in err, label
        outcomes[status] += 1
        if status == 2:
            errors = [line for line in err.splitlines() if line.startswith("teller: error:")]
            assert len(errors) == 1 and str(path) in errors[0], label
            assert not out.exists() or not any(out.iterdir()), label
        else:
            assert len(list(out.iterdir())) == 1, label
    assert outcomes[0] and outcomes[2]


def test_align_of_hostile_logs_exits_0_or_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = real_trace("hta/cuda_event_sync.json.gz")
    rng = random.Random(SEED)
    mutator = LogMutator(VLLM_LOG, "rank0")
    for index in range(10):
        variant = mutator.variant(rng)
        folder = tmp_path / str(index)
        folder.mkdir()
        path = folder / variant.name
        path.write_bytes(variant.data)
        with time_limit(30):
            status = main(["align", str(trace), str(path)])
        err = capsys.readouterr().err
        assert status in (0, 2), f"variant {index} ({variant.operator})"
        assert "Traceback" not in err
        if status == 2:
            assert str(path) in err or str(trace) in err
