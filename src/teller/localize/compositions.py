"""A batch composition that costs more than the step model's line says, every time it recurs.

The step model (`step_model`) is linear in a step's token counts. A serving engine's cost is not
always: a decode batch one sequence past a captured CUDA-graph size runs the next size up, a
kernel or a host library switches algorithm at some batch size, a batch padded to its longest
sequence costs its size times that length. Such a composition runs slower than the line each
time it recurs, while the steps between its recurrences, of other compositions, run as the line
predicts. A fault does the opposite: it slows the steps of its window whatever they batch. So
where enough recurrences of one composition are slower than the line while the steps of other
compositions around each of them are not, their median excess is the composition's own cost,
and every recurrence is expected at it: one slower than that still stands out.
"""

from __future__ import annotations

import numpy as np

from teller.callchain.facts import Iterations

#: A composition's own cost is read from this many recurrences at least: fewer are as likely to
#: be one fault window's steps.
MIN_RECURRENCES = 5
#: A recurrence is calm where it has steps of other compositions on both sides within this
#: many steps, and they ran about as the line predicts. Its composition's cost is read from its
#: calm recurrences only: a run of one composition alone cannot tell its own cost from a fault's
#: window, and inside a window the steps around a recurrence are slow too.
NEIGHBOURS = 2
#: Prompt tokens fall in bins of this width in log2 units (about ±9%): two prefills of similar
#: length are one composition, as two decodes of the same batch are.
CONTEXT_BIN = 0.25
#: A calm recurrence's neighbours' median log excess over the line is at most this share of the
#: composition's.
CALM_SHARE = 1 / 3


def composition_keys(iterations: Iterations) -> list[tuple[str, int, int]]:
    """Per iteration: its kind, its generation tokens (a decode batch's size) and its context
    tokens' log bin (-1 without context tokens)."""
    context = iterations.context_tokens
    context_bin = np.where(
        context > 0, np.round(np.log2(np.maximum(context, 1.0)) / CONTEXT_BIN), -1
    ).astype(int)
    return list(
        zip(
            (str(k) for k in iterations.kind),
            iterations.generation_tokens.astype(int).tolist(),
            context_bin.tolist(),
            strict=True,
        )
    )


def composition_costs(
    iterations: Iterations, expected_ns: np.ndarray, min_ratio: float
) -> np.ndarray:
    """Per iteration, the factor (≥ 1) by which its composition runs slower than `expected_ns`,
    read from the composition's calm recurrences (`NEIGHBOURS`) in its engine's run; 1 where
    fewer than `MIN_RECURRENCES` are calm, or where they are less than `min_ratio` slower.
    Every recurrence is expected at that cost: one inside a fault's window still stands out by
    what the fault adds."""
    factor = np.ones(len(iterations))
    log_excess = np.log(np.maximum(iterations.dur_ns, 1.0) / np.maximum(expected_ns, 1.0))
    keys = composition_keys(iterations)
    for engine in np.unique(iterations.engine).tolist():
        rows = np.flatnonzero(iterations.engine == engine)  # in iteration order
        recurrences: dict[tuple[str, int, int], list[int]] = {}
        for position, row in enumerate(rows.tolist()):
            recurrences.setdefault(keys[row], []).append(position)
        for positions in recurrences.values():
            if len(positions) < MIN_RECURRENCES:
                continue
            own = float(np.median(log_excess[rows[positions]]))
            if own < np.log(min_ratio):
                continue
            others = np.setdiff1d(np.arange(len(rows)), positions)
            calm = [
                p
                for p in positions
                if _neighbours_excess(others, p, log_excess[rows]) <= CALM_SHARE * own
            ]
            if len(calm) < MIN_RECURRENCES:
                continue
            cost = float(np.median(log_excess[rows[calm]]))
            if cost >= np.log(min_ratio):
                factor[rows[positions]] = np.exp(cost)
    return factor


def _neighbours_excess(others: np.ndarray, position: int, log_excess: np.ndarray) -> float:
    """The median log excess of the steps of other compositions within `NEIGHBOURS` steps of
    `position` (positions into the engine's run); infinite unless there are some on both sides."""
    lo, at, hi = np.searchsorted(
        others, [position - NEIGHBOURS, position, position + NEIGHBOURS + 1]
    )
    if not lo < at < hi:  # none before it, or none after it
        return float("inf")
    return float(np.median(log_excess[others[lo:hi]]))
