"""The numbers the model reads: step, token, log-line and request-queue features, by name.

Each function fills the features `teller.rca.inputs` declares (`STEP`, `TOKEN`, `LOG`, `QUEUE`)
from what the pipeline already computed: the localizer's step scores, the run's `RunFacts`, the
tree's kernels and collectives, and the one alignment of the run's logs and spans.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import numpy as np

from teller.align.requests import batch_sizes
from teller.callchain.facts import RunFacts, kernel_sequences
from teller.callchain.tree import CallTree
from teller.localize import NumericLocalizer, OperatorCandidate, StepScore
from teller.rca.inputs import (
    LOG,
    MAX_CANDIDATES,
    MAX_LOG_LINES,
    NEIGHBOUR_FEATURES,
    QUEUE,
    RUN_PEAKS,
    STEP,
    STEP_KINDS,
    TOKEN,
)

if TYPE_CHECKING:
    from teller.align.align import AlignResult

#: Hashed log-template buckets a line's template id falls into (before the checkpoint's own
#: `log_vocab` folds them again at encoding).
LOG_BUCKETS = 64
#: Log levels whose lines come first among a step's lines, and count as `severe`.
SEVERE_LEVELS = ("WARNING", "ERROR")
#: The features `add_context` reads off each step's own ones.
_KINDS = [STEP[f"kind_{kind}"] for kind in STEP_KINDS]
_WORK = [
    f"{kind}_{measure}"
    for kind in ("gpu", "host", "comm")
    for measure in ("imbalance", "over_time")
]


def safe_log_ratio(observed: float, normal: float) -> float:
    return math.log(max(observed, 1.0) / max(normal, 1.0))


def log_bucket(template_id: int, buckets: int) -> int:
    """Hashed template id in 1..buckets (0 is padding); template ids are already hashes."""
    return 1 + int(template_id) % buckets


# -- the step vector ---------------------------------------------------------------------------


def step_features(
    tree: CallTree,
    score: StepScore,
    strict: NumericLocalizer,
    work: np.ndarray,
    shift_ns: float,
    kernel_shape: dict[str, float],
    transfer: tuple[float, float],
) -> np.ndarray:
    """A step's own features (`STEP` up to `shift_size`, its kernels' and its transfer's): the
    rest need the whole run (`add_context`). `work`: its row of `work_features`; `shift_ns`: a
    persistent operator shift's excess in it (0: none); `transfer`: (log ratio, z) of its
    transfer time against the run's fit for its batch."""
    steps = tree.steps
    row = int(np.flatnonzero(steps.index == score.iteration)[0])
    vector = STEP.zeros()
    vector[STEP["z"]] = np.clip(score.z / 10.0, -2.0, 5.0)
    vector[STEP["time_ratio"]] = safe_log_ratio(score.dur_ns, score.expected_ns)
    vector[STEP["context_tokens"]] = np.log1p(max(int(steps.context_tokens[row]), 0)) / 8.0
    vector[STEP["generation_tokens"]] = np.log1p(max(int(steps.generation_tokens[row]), 0)) / 8.0
    if steps.kind[row] in STEP_KINDS:
        vector[STEP[f"kind_{steps.kind[row]}"]] = 1.0
    vector[STEP["flagged"]] = float(
        score.z >= strict.step_z and score.dur_ns >= strict.min_ratio * score.expected_ns
    )
    for name, value in zip(_WORK, work, strict=True):
        vector[STEP[name]] = value
    vector[STEP["shifted"]] = float(shift_ns > 0)
    vector[STEP["shift_size"]] = np.log1p(shift_ns / 1e5) / 4.0
    for name, value in kernel_shape.items():
        vector[STEP[name]] = value
    # the step's collectives' transfer time against the run's fit for its batch (a slower or
    # longer link: microseconds in a step of milliseconds, but steady)
    log_ratio, transfer_z = transfer
    vector[STEP["transfer_ratio"]] = np.clip(log_ratio, -1.0, 3.0)
    vector[STEP["transfer_z"]] = np.clip(transfer_z / 10.0, -2.0, 5.0)
    return vector


def add_context(steps: list[np.ndarray]) -> None:
    """Fill, in each step vector of a run (in iteration order), what needs the other steps: the
    previous and next steps' features (`previous_*`, `next_*`), the run's shape (`run_*`) and the
    step's batch against the run's usual one (`*_vs_usual`).

    Why: a fault lasts a window of steps, so a borderline step between two slow ones is more likely
    part of it (the slice's time order, T); and fault types differ in how a run degrades rather
    than in any one step (a power cap slows every step of its window alike, a co-tenant
    erratically; a contended host shows in host time, a link in collectives), which one step
    cannot show."""
    if not steps:
        return
    table = np.stack(steps)
    strict = table[:, STEP["flagged"]] > 0
    ratio = table[:, STEP["time_ratio"]]
    flagged = ratio[strict] if strict.any() else ratio[:0]
    run = {
        "run_flagged_share": strict.mean(),
        "run_max_z": table[:, STEP["z"]].max(),
        "run_flagged_time_ratio_mean": flagged.mean() if len(flagged) else 0.0,
        "run_flagged_time_ratio_std": flagged.std() if len(flagged) > 1 else 0.0,
        **{f"run_peak_{n}": table[:, STEP[n]].max() for n in RUN_PEAKS},
    }
    # the batch against the run's usual batch of the same step kind (`*_tokens` hold
    # log1p(tokens) / 8): a misconfigured scheduler shrinks batches while requests queue
    kinds = table[:, _KINDS]
    kind = kinds.argmax(axis=1) + len(_KINDS) * (kinds.max(axis=1) == 0)
    tokens = table[:, STEP.indices(["context_tokens", "generation_tokens"])]
    batch = np.clip(8.0 * against_same_kind(tokens, kind), -4, 4)
    own = STEP.indices(NEIGHBOUR_FEATURES)
    for i, vector in enumerate(steps):
        vector[STEP["context_vs_usual"]], vector[STEP["generation_vs_usual"]] = batch[i]
        if i > 0:
            for name, value in zip(NEIGHBOUR_FEATURES, table[i - 1, own], strict=True):
                vector[STEP[f"previous_{name}"]] = value
            vector[STEP["previous_transfer_z"]] = steps[i - 1][STEP["transfer_z"]]
        if i + 1 < len(steps):
            for name, value in zip(NEIGHBOUR_FEATURES, table[i + 1, own], strict=True):
                vector[STEP[f"next_{name}"]] = value
            vector[STEP["next_transfer_z"]] = steps[i + 1][STEP["transfer_z"]]
        for name, value in run.items():
            vector[STEP[name]] = value


def work_features(tree: CallTree, facts: RunFacts) -> dict[int, np.ndarray]:
    """Per iteration, for GPU, host and comm work: the largest rank's share against the median
    rank (imbalance) and against its own median over the case's steps of the same kind
    (over time), as log ratios, in the order of `STEP`'s `*_imbalance`, `*_over_time` features.

    Why the same kind: a prefill's collectives move hundreds of times a decode's bytes, so against
    the whole run's median a decode step's comm looks small even when every message of it waits
    an extra network hop (a delayed or contended link)."""
    steps = tree.steps
    # host work with the calls that mostly wait left in (`host_ns`), unlike the localizer's: the
    # shipped model's weights were learned on this measure
    measures = [facts.work.gpu_ns, facts.work.host_ns, facts.work.comm_ns]
    iterations, row = np.unique(steps.index, return_inverse=True)
    ranks, column = np.unique(steps.rank, return_inverse=True)
    kind_of = np.zeros(len(iterations), dtype=object)
    kind_of[row] = np.asarray(steps.kind, dtype=object)
    out = np.zeros((len(iterations), 2 * len(measures)), dtype=np.float32)
    for m, measure in enumerate(measures):
        grid = np.full((len(iterations), len(ranks)), np.nan)
        grid[row, column] = measure
        logs = np.log(np.maximum(np.nan_to_num(grid, nan=1.0), 1.0))
        imbalance = logs - np.median(logs, axis=1, keepdims=True)
        out[:, 2 * m] = np.clip(imbalance.max(axis=1), -3, 3)
        out[:, 2 * m + 1] = np.clip(against_same_kind(logs, kind_of).max(axis=1), -3, 3)
    return {int(it): out[i] for i, it in enumerate(iterations.tolist())}


def against_same_kind(logs: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """(steps × columns) log measures minus each column's median over the steps of the row's
    kind (per-rank work over time; the batch against the run's usual one)."""
    out = np.zeros_like(logs)
    for kind in set(kinds.tolist()):
        same = kinds == kind
        out[same] = logs[same] - np.median(logs[same], axis=0, keepdims=True)
    return out


def kernel_slowdown_shape(tree: CallTree) -> dict[int, dict[str, float]]:
    """Per iteration, how the slowest rank's compute kernels are slower than its peers' same
    kernels (`STEP`'s `kernel_*` features): median, spread and 90th percentile of the per-kernel
    log ratios against the median rank (with two ranks, half their difference), the share of
    kernels more than 10% slower, and the ratios' scatter against the run's.

    Why: the ranks of a tensor-parallel group launch the same kernels in the same order, so kernel
    i of one rank compares with kernel i of the others. A power cap slows every kernel by about
    the same factor (small spread); a co-tenant slows some kernels a lot and others not at all
    (large spread); one regressed operator slows few kernels. Step totals cannot tell these
    apart. The raw spread carries the run's own kernel jitter, so a cap's and a co-tenant's
    overlap; against the run's ordinary steps a co-tenant's scatter stands far out and a cap's
    barely. Steps whose ranks launched different kernel counts are absent (their features 0)."""
    shapes: dict[int, dict[str, float]] = {}
    scatter: dict[int, float] = {}
    for iteration, sequences in kernel_sequences(tree).items():
        counts = {len(rows) for _, rows in sequences}
        if len(sequences) < 2 or len(counts) != 1 or 0 in counts:
            continue
        durations = np.stack([tree.dur[rows] for _, rows in sequences]).astype(np.float64)
        logs = np.log(np.maximum(durations, 1.0))
        ratios = logs - np.median(logs, axis=0, keepdims=True)
        slowest = ratios[int(ratios.mean(axis=1).argmax())]
        shapes[iteration] = {
            "kernel_median": np.clip(np.median(slowest), -3, 3),
            "kernel_spread": np.clip(slowest.std(), 0, 3),
            "kernel_p90": np.clip(np.percentile(slowest, 90), -3, 3),
            "kernel_slower_share": (slowest > 0.1).mean(),
            "kernel_scatter": 0.0,
        }
        scatter[iteration] = float(np.median(np.abs(slowest - np.median(slowest))))
    if scatter:
        usual = max(float(np.median(list(scatter.values()))), 1e-3)
        for iteration, value in scatter.items():
            shapes[iteration]["kernel_scatter"] = (
                np.clip(np.log(max(value, 1e-6) / usual), -2, 4) / 2
            )
    return shapes


# -- a trace token -----------------------------------------------------------------------------


def token_features(
    vector: np.ndarray,
    dur_ns: int,
    depth: int,
    candidate: OperatorCandidate | None = None,
    order: int = 0,
) -> None:
    """Fill one token's `TOKEN` vector; `candidate` (the `order`-th of its step) for a focus
    token."""
    vector[TOKEN["log_duration"]] = np.log1p(dur_ns / 1e3) / 10.0
    vector[TOKEN["depth"]] = depth / 20.0
    if candidate is None:
        return
    vector[TOKEN["candidate_ratio"]] = safe_log_ratio(candidate.observed_ns, candidate.normal_ns)
    vector[TOKEN["candidate_score"]] = np.log1p(max(candidate.score, 0.0) / 1e3) / 10.0
    vector[TOKEN["candidate_z"]] = np.clip(candidate.z / 100.0, -3.0, 3.0)
    vector[TOKEN["candidate_order"]] = order / MAX_CANDIDATES


# -- the log modality --------------------------------------------------------------------------


StepLines = tuple[np.ndarray, np.ndarray, list[str]]  # template buckets, LOG vectors, raw text


def log_features(
    tree: CallTree, alignment: AlignResult | None
) -> tuple[dict[int, StepLines], dict[int, np.ndarray]]:
    """Per iteration: the hashed templates, `LOG` vectors and raw text of its aligned log lines
    (warnings and errors first, then in file order; at most MAX_LOG_LINES); and the request
    queue's `QUEUE` vector (`queue_features`). Empty without an alignment."""
    if alignment is None:
        return {}, {}
    logs = alignment.logs
    step = alignment.alignment.step
    queues = queue_features(tree, alignment.waiting, alignment.kv_fill, alignment.held_back)
    templates = logs.column("template_id")
    fields = logs.column("fields")
    levels = logs.column("level")
    raw = logs.column("raw")
    by_step: dict[int, list[int]] = {}
    for i, s in enumerate(step.tolist()):
        if s >= 0:
            by_step.setdefault(int(s), []).append(i)
    out = {}
    for s, rows in by_step.items():
        rows = sorted(rows, key=lambda i: (levels[i] not in SEVERE_LEVELS, i))
        rows = rows[:MAX_LOG_LINES]
        vectors = np.stack([line_features(fields[i], levels[i]) for i in rows])
        buckets = np.array([log_bucket(templates[i] or 0, LOG_BUCKETS) for i in rows], np.int64)
        out[s] = (buckets, vectors, [raw[i] for i in rows])
    return out, queues


def line_features(fields: str | None, level: str | None) -> np.ndarray:
    """One line's `LOG` vector: its first numeric `fields` by key order, log-scaled, and whether
    it is a warning or an error.

    The numbers are read from the display JSON by position, not as named quantities: on the
    training cases each line shape puts other keys in these places (default_model/README.md
    lists them), so no one typed column per position reproduces what the checkpoints learned."""
    vector = LOG.zeros()
    vector[LOG["severe"]] = level in SEVERE_LEVELS
    if not fields:
        return vector
    try:
        data = json.loads(fields)
    except json.JSONDecodeError:
        return vector
    numbers = [v for _, v in sorted(data.items()) if isinstance(v, int | float)]
    slots = vector[LOG["fields"]]
    for j, v in enumerate(numbers[: len(slots)]):
        slots[j] = np.sign(v) * np.log1p(abs(float(v))) / 10.0
    return vector


def queue_features(
    tree: CallTree,
    waiting: dict[int, int],
    kv_fill: dict[int, float],
    held_back: dict[int, int],
) -> dict[int, np.ndarray]:
    """Per iteration, the request queue's `QUEUE` vector: requests waiting, the step's requests
    and tokens against the run's largest batch (0 where the steps do not state their batch),
    requests held back, and the KV cache's fill (the last the logs stated at or before the step).

    Why: a scheduler capped too low leaves requests queued while batches run below what the
    engine ran before, and steps get shorter, not longer; no step time or operator shows it. The
    queue comes from the request records (logs, spans), so it travels in the log modality and is
    absent with them. Held back: a run that starts with a queue admits at its token budget (full
    batches of prefill while requests wait, nothing held back); a saturated run has no room; a
    capped scheduler leaves room and budget unused while requests wait, which is the fault
    itself."""
    steps = tree.steps
    if not (waiting or kv_fill) or not len(steps):
        return {}
    rows, requests, tokens = batch_sizes(tree)
    most_requests, most_tokens = requests.max(), tokens.max()
    out = {}
    fill = None
    for k in np.argsort(steps.index[rows], kind="stable").tolist():
        iteration = int(steps.index[rows[k]])
        fill = kv_fill.get(iteration, fill)
        if iteration not in waiting and fill is None:
            continue
        vector = QUEUE.zeros()
        if iteration in waiting:
            vector[QUEUE["waiting"]] = np.log1p(waiting[iteration]) / 4.0
            if most_requests > 0:
                ratio = safe_log_ratio(requests[k], most_requests)
                vector[QUEUE["requests_vs_largest"]] = np.clip(ratio, -4, 0)
            if most_tokens > 0:
                ratio = safe_log_ratio(tokens[k], most_tokens)
                vector[QUEUE["tokens_vs_largest"]] = np.clip(ratio, -8, 0) / 2.0
            vector[QUEUE["held_back"]] = np.log1p(held_back.get(iteration, 0)) / 4.0
        if fill is not None:
            vector[QUEUE["kv_cache_fill"]], vector[QUEUE["kv_cache_known"]] = fill, 1.0
        out[iteration] = vector
    return out
