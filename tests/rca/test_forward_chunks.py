"""The members read a run's steps a chunk at a time (`FORWARD_CHUNK_STEPS`), so that a long
run's activations are a chunk's, and the explanation head reads the flagged steps' tokens again
(`LoadedModel._mechanisms`) instead of every step's being kept; a step's outputs must not
depend on the chunking."""

from __future__ import annotations

import numpy as np
import pytest

from teller.analysis import Analysis
from teller.callchain.facts import RunFacts
from teller.rca import infer
from teller.rca.dataset import case_records
from teller.rca.infer import DEFAULT_MODEL, LoadedModel

from .conftest import small_case
from .test_explain import _model_loads


def test_a_run_read_in_chunks_gets_the_diagnoses_of_one_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not _model_loads():
        pytest.skip("no loadable default model")
    model = LoadedModel.load(DEFAULT_MODEL)
    analysis = Analysis(small_case("straggler", rank=1, seed=11, gpus=4))
    tree = analysis.tree
    records = case_records(tree, "", None, analysis.alignment, RunFacts.of(tree, None))
    monkeypatch.setattr(infer, "FORWARD_CHUNK_STEPS", 1 << 30)
    whole = model.forward(records)
    monkeypatch.setattr(infer, "FORWARD_CHUNK_STEPS", 4)  # 30 steps: 8 chunks, the last of 2
    chunked = model.forward(records)

    for name in ("probability", "pointer", "fault_logp"):
        np.testing.assert_allclose(getattr(chunked, name), getattr(whole, name), atol=1e-5)

    def said(outputs: infer.ModelOutputs) -> list[tuple]:
        return [
            (d.iteration, d.anomalous, d.fault, [c.operator for c, _ in d.candidates[:1]])
            for d in model.diagnose_records(records, outputs=outputs)
        ]

    assert said(chunked) == said(whole)
    assert any(anomalous for _, anomalous, _, _ in said(whole))

    # the explanation head's scores, from the flagged steps' tokens read again in chunks of 3
    def mechanisms(outputs: infer.ModelOutputs) -> list[list[float] | None]:
        return [d.mechanism_scores for d in model.diagnose_records(records, outputs=outputs)]

    monkeypatch.setattr(infer, "FORWARD_CHUNK_STEPS", 3)
    read_again = mechanisms(chunked)
    monkeypatch.setattr(infer, "FORWARD_CHUNK_STEPS", 1 << 30)
    for mine, theirs in zip(read_again, mechanisms(whole), strict=True):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            np.testing.assert_allclose(mine, theirs, atol=1e-5)
    assert sum(m is not None for m in read_again) > 3  # more flagged steps than one chunk holds
