"""A step kind's time follows the one token count that varies in it.

A decode-only kind has no context tokens and a prefill-only kind no generation tokens; the
step line must still grow with the count that does vary, or every large decode batch reads as
slow and every small one hides a slowdown. On the repository's recorded lab run (fault-free,
TP 2) decode batches hold 1 to 16 requests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from teller.callchain.facts import RunFacts
from teller.callchain.tree import build_tree
from teller.ingest import read_run
from teller.localize.step_model import design, fit_step_model

LAB_TRACES = Path(__file__).parents[1] / "align" / "data" / "lab_none_tp2" / "traces"


@pytest.fixture(scope="module")
def recorded() -> RunFacts:
    return RunFacts(build_tree(read_run([LAB_TRACES])))


def test_decode_steps_are_expected_to_grow_with_their_batch(recorded):
    iterations = recorded.iterations
    decode = iterations.kind == "decode"
    dur = iterations.dur_ns[decode]
    ctx, gen = iterations.context_tokens[decode], iterations.generation_tokens[decode]
    assert not ctx.any() and len(np.unique(gen)) > 3
    model = fit_step_model(dur, ctx, gen, keep=0.6)
    per_request = model.coef[2]
    assert per_request > 0
    expected = design(ctx, gen) @ model.coef
    flat = np.full(len(dur), float(np.median(dur)))
    # the line fits the recorded steps better than one time for every decode batch does
    spread = np.median(np.abs(np.log(dur / expected)))
    flat_spread = np.median(np.abs(np.log(dur / flat)))
    assert spread < flat_spread
    largest, smallest = gen == gen.max(), gen == gen.min()
    assert expected[largest].mean() > expected[smallest].mean() * 1.2


def test_a_prefill_only_kind_follows_its_prompt_length():
    ctx = np.array([100, 200, 300, 400, 500, 600, 700, 800], dtype=float)
    gen = np.zeros_like(ctx)
    dur = 5e6 + 2e4 * ctx
    model = fit_step_model(dur, ctx, gen, keep=0.9)
    assert model.coef[1] == pytest.approx(2e4, rel=1e-6)
    assert model.coef[0] == pytest.approx(5e6, rel=1e-6)


def test_a_kind_whose_batch_never_varies_is_expected_at_its_median():
    dur = np.array([10e6, 11e6, 9e6, 10.5e6, 30e6])
    ctx, gen = np.zeros(5), np.ones(5)
    model = fit_step_model(dur, ctx, gen, keep=0.8)
    assert model.coef[1] == model.coef[2] == 0
    assert model.coef[0] == pytest.approx(10e6, rel=0.06)
