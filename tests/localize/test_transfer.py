"""Transfer residuals: a contended link shows in the steps' collectives, nothing else does."""

from __future__ import annotations

import numpy as np

from lab.test_sim_cases import WINDOW, case
from teller.localize.transfer import transfer_residuals


def window_split(residuals: dict[int, tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    inside = np.array([z for it, (_, z) in residuals.items() if WINDOW[0] <= it < WINDOW[1]])
    outside = np.array([z for it, (_, z) in residuals.items() if not WINDOW[0] <= it < WINDOW[1]])
    return inside, outside


def test_a_contended_link_raises_every_window_step_above_the_rest():
    # the window covers half the run: the fit and the scale must come from the normal part
    _, _, tree = case(fault="link_contention", rank=1)
    inside, outside = window_split(transfer_residuals(tree))
    assert len(inside) >= 15 and len(outside) >= 15
    assert inside.min() > outside.max()
    assert inside.min() > 5.0 and outside.max() < 3.0


def test_a_slower_gpu_leaves_the_transfers_alone():
    _, _, tree = case(fault="gpu_throttle", rank=1)
    inside, outside = window_split(transfer_residuals(tree))
    assert len(inside) >= 15
    assert max(inside.max(), outside.max()) < 3.0


def test_a_single_rank_run_has_no_transfers():
    _, _, tree = case(fault="none", tp=1, gpus=1, rank=0)
    assert transfer_residuals(tree) == {}
