"""The step model: a step's time against what its batch and its sequences' lengths predict."""

from __future__ import annotations

import numpy as np

from teller.localize.step_model import design, fit_step_model

RNG = np.random.default_rng(7)


def _decodes(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode steps of 1-16 sequences over 100-3,000 cached tokens: (batch, cached, ns), each
    step 80 ms plus 2 ms per sequence plus 50 µs per cached token, with 3% noise."""
    batch = RNG.integers(1, 17, count).astype(float)
    cached = batch * RNG.uniform(100, 190, count)
    dur = (80e6 + 2e6 * batch + 5e4 * cached) * RNG.lognormal(0.0, 0.03, count)
    return batch, cached, dur


def test_decode_steps_are_fitted_on_their_batch_and_cached_tokens() -> None:
    batch, cached, dur = _decodes(60)
    model = fit_step_model(dur, np.zeros(60), batch, keep=0.6, cached=cached)
    predicted = design(np.zeros(60), batch, cached) @ model.coef
    # the fit keeps the faster 60%: a little under the middle, never a cost it cannot see
    assert np.all(np.abs(np.log(dur / predicted)) < 0.12)
    assert model.log_scale < 0.06


def test_long_steps_do_not_set_the_fit_for_the_short_ones() -> None:
    """A few very long steps (a burst of long sequences) fitted in absolute terms would leave the
    one-sequence steps predicted at a fraction of their time."""
    batch, cached, dur = _decodes(30)
    batch = np.concatenate([batch, [16.0] * 15])
    cached = np.concatenate([cached, RNG.uniform(2000, 2600, 15)])
    dur = np.concatenate([dur, RNG.uniform(450e6, 560e6, 15)])  # far over what their tokens cost
    model = fit_step_model(dur, np.zeros(45), batch, keep=0.6, cached=cached)
    one = design(np.zeros(1), np.array([1.0]), np.array([150.0])) @ model.coef
    assert 0.8 < one[0] / (80e6 + 2e6 + 5e4 * 150) < 1.1


def test_a_run_without_cached_tokens_fits_batch_alone() -> None:
    batch, _, dur = _decodes(40)
    model = fit_step_model(dur, np.zeros(40), batch, keep=0.6)
    assert model.coef[3] == 0.0 and model.coef[2] > 0.0


def test_steps_of_one_batch_fit_a_constant() -> None:
    dur = RNG.normal(100e6, 1e6, 20)
    model = fit_step_model(dur, np.zeros(20), np.full(20, 4.0), keep=0.6, cached=np.zeros(20))
    assert model.coef[1:].tolist() == [0.0, 0.0, 0.0]
    assert 95e6 < model.coef[0] < 101e6
