"""The root-cause model's inputs, by name: the feature layouts, the token vocabularies, the batch.

Each numeric vector the model reads (a step's, a trace token's, a log line's, the request queue's)
is declared here as a `Layout`: its features in order, each with its width and how its value is
scaled. Code writes and reads a feature by its name (`vector[STEP["transfer_z"]]`), so what a
float means is written in one place. The order is the one the shipped checkpoints were trained
on: a feature added, removed or moved needs a retrained model (and a new checkpoint format).

Nothing here needs torch: records and their encoding are built without it, and `Batch` holds
numpy arrays until the model's caller turns them into tensors (`Batch.map`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Generic, TypeVar

import numpy as np

from teller.faults import FAULTS

#: Fault types the explanation head chooses between, in a fixed order (saved with the model).
FAULT_NAMES: tuple[str, ...] = tuple(FAULTS)
#: Candidate kinds as the model names them; 0 is a context (non-candidate) token.
CANDIDATE_KINDS = ("context", "compute", "arrival", "transfer")
#: Token roles: padding, ancestor context, a candidate's own (focus) token.
ROLE_PAD, ROLE_CONTEXT, ROLE_FOCUS = 0, 1, 2
#: Step kinds the step vector one-hot encodes (another kind leaves all three 0).
STEP_KINDS = ("prefill", "decode", "mixed")

#: Candidate nodes per step, and tokens of ancestor context per candidate (its deepest ones).
MAX_CANDIDATES = 8
PATH_TOKENS = 6
MAX_TRACE_TOKENS = MAX_CANDIDATES * PATH_TOKENS
#: Log positions per step: aligned lines, then the request queue's own position.
MAX_LOG_LINES = 8


@dataclass(frozen=True)
class Feature:
    """One named part of a feature vector: how many floats it takes and how it is scaled."""

    name: str
    width: int
    scale: str


@dataclass(frozen=True)
class Layout:
    """A feature vector's features in order: name → position (an index for a one-float feature,
    a slice for a wider one)."""

    features: tuple[Feature, ...]
    _positions: dict[str, int | slice] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        positions: dict[str, int | slice] = {}
        start = 0
        for feature in self.features:
            if feature.name in positions:
                raise ValueError(f"feature {feature.name!r} declared twice")
            end = start + feature.width
            positions[feature.name] = start if feature.width == 1 else slice(start, end)
            start = end
        object.__setattr__(self, "_positions", positions)

    @property
    def width(self) -> int:
        return sum(f.width for f in self.features)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    def __getitem__(self, name: str) -> int | slice:
        return self._positions[name]

    def indices(self, names: Sequence[str]) -> list[int]:
        """Positions of one-float features, for picking columns out of a table of vectors."""
        found = [self._positions[n] for n in names]
        if not all(isinstance(p, int) for p in found):
            raise ValueError(f"not all one-float features: {list(names)}")
        return found  # type: ignore[return-value]

    def zeros(self) -> np.ndarray:
        return np.zeros(self.width, dtype=np.float32)


def _features(*rows: tuple[str, str] | tuple[str, int, str]) -> tuple[Feature, ...]:
    """`(name, scale)` for a one-float feature, `(name, width, scale)` for a wider one."""
    return tuple(Feature(row[0], 1, row[1]) if len(row) == 2 else Feature(*row) for row in rows)


#: Busiest rank's work against the median rank (imbalance) and against its own steps of the same
#: kind (over time): GPU (kernels and copies), host (self time of operators and runtime calls,
#: waits included), comm (collectives, waiting for peers included).
_WORK = tuple(
    row
    for kind in ("gpu", "host", "comm")
    for row in (
        (f"{kind}_imbalance", f"log(busiest rank's {kind} work / the median rank's), clipped ±3"),
        (
            f"{kind}_over_time",
            f"the largest, over ranks, of log({kind} work / that rank's median over steps of "
            "the same kind), clipped ±3",
        ),
    )
)
#: A step's features its neighbours lend it (`previous_*`, `next_*`).
NEIGHBOUR_FEATURES = ("z", "time_ratio", "flagged", "shifted")
#: The run's largest work ratios, lent to every step (`run_peak_*`).
RUN_PEAKS = ("gpu_over_time", "host_over_time", "comm_over_time", "gpu_imbalance")

#: One step of a run (all ranks). Features up to `shift_size` are the step's own; the rest are
#: filled once all of the run's steps are known (`features.add_context`).
STEP = Layout(
    _features(
        ("z", "the localizer's robust z-score of the step's time / 10, clipped to [-2, 5]"),
        ("time_ratio", "log(step time / the time its batch predicts)"),
        ("context_tokens", "log1p(the step's context tokens) / 8"),
        ("generation_tokens", "log1p(the step's generation tokens) / 8"),
        *((f"kind_{kind}", f"1 for a {kind} step, else 0") for kind in STEP_KINDS),
        ("flagged", "1 where the localizer at its own thresholds flags the step, else 0"),
        *_WORK,
        ("shifted", "1 where one rank's operator runs slower than its peers' step after step"),
        ("shift_size", "log1p(that shift's excess ns / 1e5) / 4"),
        *(
            (f"previous_{n}", f"the previous step's {n} (0 for the first)")
            for n in NEIGHBOUR_FEATURES
        ),
        *((f"next_{n}", f"the next step's {n} (0 for the last)") for n in NEIGHBOUR_FEATURES),
        ("run_flagged_share", "share of the run's steps `flagged`"),
        ("run_max_z", "the run's largest `z`"),
        ("run_flagged_time_ratio_mean", "mean `time_ratio` of the flagged steps (0: none)"),
        ("run_flagged_time_ratio_std", "its standard deviation (0: fewer than two)"),
        *((f"run_peak_{n}", f"the run's largest `{n}`") for n in RUN_PEAKS),
        (
            "kernel_median",
            "median log ratio of the slowest rank's kernels to the median rank's same kernels, "
            "clipped ±3 (the four kernel_* features are 0 where ranks launched different counts)",
        ),
        ("kernel_spread", "standard deviation of those log ratios, clipped to [0, 3]"),
        ("kernel_p90", "their 90th percentile, clipped ±3"),
        ("kernel_slower_share", "share of them above 0.1 (kernels more than ~10% slower)"),
        (
            "context_vs_usual",
            "log(context tokens / the run's median for steps of this kind), clipped ±4",
        ),
        ("generation_vs_usual", "the same for generation tokens"),
        (
            "transfer_ratio",
            "log(the step's transfer time / the run's fit for its batch), clipped to [-1, 3]",
        ),
        ("transfer_z", "that transfer time's z / 10, clipped to [-2, 5]"),
        ("previous_transfer_z", "the previous step's transfer_z (0 for the first)"),
        ("next_transfer_z", "the next step's transfer_z (0 for the last)"),
        (
            "kernel_scatter",
            "log(median absolute deviation of the slowest rank's kernel log ratios / the run's "
            "median of it), clipped to [-2, 4], / 2",
        ),
    )
)

#: One token of a candidate's ancestor path; the candidate_* features only on its focus token.
TOKEN = Layout(
    _features(
        ("log_duration", "log1p(the token's time in µs) / 10"),
        ("depth", "its depth in the call tree / 20"),
        ("candidate_ratio", "log(the candidate's observed time / its normal time)"),
        ("candidate_score", "log1p(the candidate's score, floored at 0, / 1e3) / 10"),
        ("candidate_z", "the candidate's z / 100, clipped ±3"),
        ("candidate_order", "the candidate's place among the step's candidates / MAX_CANDIDATES"),
    )
)

#: One aligned log line.
LOG = Layout(
    _features(
        (
            "fields",
            5,
            "the first five numbers of the line's `fields` in key order, sign · log1p(|v|) / 10 "
            "(not named quantities: default_model/README.md says why)",
        ),
        ("severe", "1 for a WARNING or ERROR line"),
    )
)

#: The request queue at a step: one more log position, of its own template slot.
QUEUE = Layout(
    _features(
        ("waiting", "log1p(requests arrived and not yet admitted at the step's start) / 4"),
        (
            "requests_vs_largest",
            "log(the step's requests / the run's largest batch), clipped [-4, 0]",
        ),
        (
            "tokens_vs_largest",
            "log(the step's tokens / the run's largest step's), clipped [-8, 0], / 2",
        ),
        (
            "held_back",
            "log1p(waiting requests the step had room for while its tokens stayed under "
            "TOKEN_ROOM of the run's largest step) / 4",
        ),
        ("kv_cache_fill", "the KV cache's fill (0-1) the logs last stated at or before the step"),
        ("kv_cache_known", "1 where that fill is known"),
    )
)

if QUEUE.width != LOG.width:  # one projection reads both
    raise ValueError("the queue's position must be as wide as a log line's")

A = TypeVar("A")  # numpy arrays out of encoding, torch tensors into the model
B = TypeVar("B")


@dataclass
class Batch(Generic[A]):
    """Padded arrays of `n` examples, what encoding hands the model; the labels are None at
    inference. T = MAX_TRACE_TOKENS, L = MAX_LOG_LINES."""

    tok_kind: A  # (n, T) TPE kind id
    tok_layer: A  # (n, T) layer code
    tok_rank: A  # (n, T) rank (only which tokens share one matters)
    tok_ckind: A  # (n, T) CANDIDATE_KINDS index on focus tokens, 0 elsewhere
    tok_role: A  # (n, T) ROLE_*
    tok_float: A  # (n, T, TOKEN.width)
    focus_candidate: A  # (n, T) the focus token's candidate in its record, -1 elsewhere
    step_float: A  # (n, STEP.width)
    log_template: A  # (n, L) hashed template 1..log_vocab, log_vocab + 1 the queue, 0 none
    log_float: A  # (n, L, LOG.width), the queue's position QUEUE.width
    y_step: A | None = None  # (n,) 1 for an anomalous step
    y_ptr: A | None = None  # (n,) the guilty candidate's focus token, -1 none
    y_fault: A | None = None  # (n,) FAULT_NAMES index
    y_mechanism: A | None = None  # (n,) `teller.rca.plans.MECHANISMS` index, -1 none

    @classmethod
    def blank(cls, n: int, labels: bool = True) -> Batch[np.ndarray]:
        """`n` examples of padding (no token, no line), the labels "normal, no pointer"."""
        tokens = (n, MAX_TRACE_TOKENS)
        return Batch(
            tok_kind=np.zeros(tokens, np.int64),
            tok_layer=np.zeros(tokens, np.int64),
            tok_rank=np.zeros(tokens, np.int64),
            tok_ckind=np.zeros(tokens, np.int64),
            tok_role=np.zeros(tokens, np.int64),
            tok_float=np.zeros((*tokens, TOKEN.width), np.float32),
            focus_candidate=np.full(tokens, -1, np.int64),
            step_float=np.zeros((n, STEP.width), np.float32),
            log_template=np.zeros((n, MAX_LOG_LINES), np.int64),
            log_float=np.zeros((n, MAX_LOG_LINES, LOG.width), np.float32),
            y_step=np.zeros(n, np.float32) if labels else None,
            y_ptr=np.full(n, -1, np.int64) if labels else None,
            y_fault=np.zeros(n, np.int64) if labels else None,
            y_mechanism=np.full(n, -1, np.int64) if labels else None,
        )

    def __len__(self) -> int:
        return len(self.step_float)  # type: ignore[arg-type]

    def arrays(self) -> dict[str, A]:
        """Field name → array, the absent labels left out (what `np.savez` stores)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, A]) -> Batch[A]:
        return cls(**arrays)

    def map(self, convert: Callable[[A], B]) -> Batch[B]:
        """Every array converted (`torch.from_numpy`, a row selection)."""
        return Batch(**{name: convert(v) for name, v in self.arrays().items()})

    def rows(self, index: object) -> Batch[A]:
        return self.map(lambda v: v[index])  # type: ignore[index]

    def inputs(self) -> Batch[A]:
        """The batch without its labels: what inference reads."""
        return replace(self, y_step=None, y_ptr=None, y_fault=None, y_mechanism=None)
