"""The measured facts an explanation may state about one flagged step, and nothing else.

An explanation's slots (`teller.rca.plans`) are filled from a `StepContext`: the step's time on
the named rank against what its batch predicts, the pointed candidate against its normal, the
operator's time on the peer ranks in the same step, when and how late the rank reached the step's
collectives and how long its peers waited there, the rank's host, GPU and idle time against its
normal steps of the same kind, where the rank's step time went (`teller.callchain.breakdown`:
its GPU idle time and what its host was doing meanwhile), and the step's batch against the run's.
Each is read from the call tree and its `RunFacts`; a fact the trace does not hold is None, and a
plan that needs it is not chosen.

`RunContext` builds the per-run tables once (the arrival table, per-rank work, idle gaps, the
breakdown) and gives each flagged step its context.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from teller.align.host import HostSteps
from teller.callchain.breakdown import StepBreakdown, breakdown_of
from teller.callchain.facts import RunFacts
from teller.callchain.tree import CallTree
from teller.localize import OperatorCandidate, StepScore
from teller.localize.idle import run_idle_gaps
from teller.rca.link_size import SizeGrowth
from teller.rca.plans import collective_word


@dataclass(frozen=True)
class Measured:
    """One quantity in this step against its normal (median over the normal steps)."""

    observed_ns: float
    normal_ns: float

    @property
    def excess_ns(self) -> float:
        return self.observed_ns - self.normal_ns


@dataclass(frozen=True)
class LateArrivals:
    """The step's collectives the rank reached last, later than its peers."""

    count: int
    kind: str  # the commonest collective kind among them, as a sentence says it
    #: The smallest and largest message among them whose size the trace records (a wrapper op such
    #: as c10d::allreduce_ records a TensorList of no element type); None where none is recorded.
    size_bytes: float | None
    largest_bytes: float | None
    late_ns: float  # its arrival after the median of its peers', summed
    usual_late_ns: float  # the same in its normal steps of this kind (median; 0 without any)
    waited_ns: float  # the peers' wait for it there (median over peers), summed
    own_ns: float  # its own time in them, summed


@dataclass
class StepContext:
    """What one flagged step's explanation may say."""

    iteration: int
    kind: str
    step_dur_ns: int  # the slowest rank's time for the step
    expected_ns: int  # what the step's batch predicts
    rank: int | None  # the named rank (the pointed candidate's)
    rank_dur_ns: int  # the named rank's own time for the step (the slowest's without a rank)
    ranks: int  # ranks in the trace
    candidate: OperatorCandidate | None
    others: list[OperatorCandidate] = field(default_factory=list)  # the step's other candidates
    peers_ns: float | None = None  # the pointed operator's time on the peers, this step (median)
    peer_rank: int | None = None  # the one peer, where there is one
    arrivals: LateArrivals | None = None
    host: Measured | None = None
    gpu: Measured | None = None
    idle: Measured | None = None
    transfer: Measured | None = None
    context_tokens: tuple[int, int] | None = None  # this step's, its normal steps' median
    batch_tokens: tuple[int, int] | None = None  # this step's, the run's largest step's
    #: waiting requests the step had room for (`teller.align.requests.held_back_requests`);
    #: None where the run's queue is unknown
    held_back: int | None = None
    #: requests the engine's logs say it preempted in the step (`AlignResult.preempted`); None
    #: where the run has no engine logs
    preempted: int | None = None
    has_logs: bool = False
    unfinished: bool = False  # a step a hang never let finish
    #: the step is the first the capture holds on the named rank (and not its only one), where
    #: one-time set-up lands: the allocator's first blocks, autotuning, lazy module loading
    first_step: bool = False
    only_step: bool = False  # the capture holds this one step per rank: nothing to expect from
    #: the named rank's host counters over the step against its normal steps (`MEASURES` of
    #: `teller.align.host`), where `teller collect` sampled them; None without
    host_counters: dict[str, Measured] | None = None
    #: where the named rank's time went in the step (GPU busy, idle and its causes); None where
    #: the rank has no GPU activity in the trace
    breakdown: StepBreakdown | None = None
    #: the named rank's own collective time in the step and its peers' median, where the run
    #: has collectives and peers: a slow link's end stands out only where its own time does
    rank_transfers: tuple[float, float] | None = None
    #: the peers `rank_transfers` compares the named rank with
    transfer_peers: tuple[int, ...] = ()
    #: a slow link's collectives over its incident's flagged steps, by size
    #: (`teller.rca.link_size`); None where the sizes could not tell or the fault is no link's
    link_growth: SizeGrowth | None = None

    @property
    def excess_ns(self) -> float:
        """The step's time beyond what its batch predicts, on the named rank (≥ 0)."""
        return float(max(self.rank_dur_ns - self.expected_ns, 0))

    @property
    def one_rank(self) -> bool:
        return self.ranks < 2


@dataclass(frozen=True)
class _CommTable:
    """One row per (collective instance, rank) inside a step, sorted by instance."""

    iteration: np.ndarray
    rank: np.ndarray
    instance: np.ndarray
    start_ns: np.ndarray
    own_ns: np.ndarray
    kind: np.ndarray  # object: the collective kind as a sentence says it
    size_bytes: np.ndarray  # float, NaN where unknown
    late_ns: np.ndarray  # after the median of the others' starts, ≥ 0
    wait_ns: np.ndarray  # before the last arriver's start, ≥ 0
    last: np.ndarray  # bool: the instance's last arriver


def _comm_table(tree: CallTree) -> _CommTable | None:
    """The run's collective instances with each rank's lateness and wait; arrivals are read on
    the GPU where collectives run there (as `teller.callchain.facts.arrivals_of` reads them)."""
    comm = tree.comm
    if not len(comm):
        return None
    use = tree.step[comm.node] >= 0
    on_gpu = tree.stream[comm.node] >= 0
    own = (comm.end_ns - comm.start_ns).astype(float)
    ready = comm.start_ns.astype(np.int64)
    if on_gpu.any():
        use &= on_gpu
    else:
        use, own, ready = _host_collectives(tree, use, own)
    rows = np.flatnonzero(use)
    rows = rows[np.argsort(comm.instance[rows], kind="stable")]
    if not len(rows):
        return None
    instance = comm.instance[rows]
    start = ready[rows]
    late = np.zeros(len(rows))
    wait = np.zeros(len(rows))
    last = np.zeros(len(rows), dtype=bool)
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(instance)) + 1, [len(rows)]])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        if hi - lo < 2:
            continue
        starts = start[lo:hi]
        latest = int(np.argmax(starts))
        last[lo + latest] = True
        wait[lo:hi] = starts[latest] - starts
        for k in range(hi - lo):
            late[lo + k] = max(0.0, float(starts[k] - np.median(np.delete(starts, k))))
    size = comm.bytes[rows].astype(float)
    size[size < 0] = np.nan
    return _CommTable(
        iteration=tree.steps.index[tree.step[comm.node[rows]]],
        rank=comm.rank[rows].astype(np.int64),
        instance=instance,
        start_ns=start,
        own_ns=own[rows],
        kind=np.array([collective_word(comm.kind[i]) for i in rows.tolist()], dtype=object),
        size_bytes=size,
        late_ns=late,
        wait_ns=wait,
        last=last,
    )


def _host_collectives(
    tree: CallTree, use: np.ndarray, own: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host-side collectives counted once, with their whole time and when the rank was ready.

    gloo records a collective twice: the call in the caller's stack (it only enqueues the work)
    and the work on a background thread, a root of its own (the transfer). Where a rank has
    both, as many as each other, its calls are its collectives, each call's time is that of the
    work it enqueued (the next of that rank's background rows), and the rank is ready for the
    transfer when both have begun: a throttled rank's background thread can start its work long
    after the call, and its peers wait for the work, not the call."""
    comm = tree.comm
    called = tree.parent[comm.node] >= 0
    own = own.copy()
    ready = comm.start_ns.astype(np.int64)
    for rank in np.unique(comm.rank[use]).tolist():
        mine = use & (comm.rank == rank)
        calls = np.flatnonzero(mine & called)
        work = np.flatnonzero(mine & ~called)
        if not len(calls) or not len(work):
            continue
        use = use & ~(mine & ~called)
        if len(calls) == len(work):
            calls = calls[np.argsort(comm.start_ns[calls], kind="stable")]
            work = work[np.argsort(comm.start_ns[work], kind="stable")]
            own[calls] = own[work]
            ready[calls] = np.maximum(ready[calls], ready[work])
    return use, own, ready


class RunContext:
    """A run's per-run tables for explanations, built once; `context` gives one step's facts.

    `normal` holds the iterations the verdict did not flag: a rank's usual host, GPU and idle
    time is its median over those of the same kind. `held_back`: per iteration, the waiting
    requests it had room for, where the run's request records tell (`AlignResult.held_back`);
    `preempted`: per iteration, the requests the engine logged it preempted, where the run has
    engine logs (`AlignResult.preempted`)."""

    def __init__(
        self,
        tree: CallTree,
        facts: RunFacts | None,
        normal: Collection[int],
        has_logs: bool,
        host: HostSteps | None = None,
        held_back: dict[int, int] | None = None,
        preempted: dict[int, int] | None = None,
    ) -> None:
        self.tree = tree
        self.facts = RunFacts.of(tree, facts)
        self.normal = set(normal)
        self.has_logs = has_logs
        self.host = host
        self.held_back = held_back or {}
        self.preempted = preempted
        steps = tree.steps
        self.ranks = sorted(set(steps.rank.tolist()))
        self.row_of = {(int(steps.rank[k]), int(steps.index[k])): k for k in range(len(steps))}
        self.first_of = _first_iteration_of(steps.rank, steps.index)
        iterations = self.facts.iterations
        self.kind_of = dict(
            zip(iterations.iteration.tolist(), iterations.kind.tolist(), strict=True)
        )
        self.engine_of = dict(
            zip(iterations.iteration.tolist(), iterations.engine.tolist(), strict=True)
        )
        self.context_of = dict(
            zip(iterations.iteration.tolist(), iterations.context_tokens.tolist(), strict=True)
        )
        self.tokens_of = {
            int(it): int(c + g)
            for it, c, g in zip(
                iterations.iteration.tolist(),
                iterations.context_tokens.tolist(),
                iterations.generation_tokens.tolist(),
                strict=True,
            )
        }
        self.comm = self.facts.derived("rca.comm_table", lambda: _comm_table(tree))
        self.idle_of = self.facts.derived("rca.idle_totals", lambda: _idle_totals(self.facts))
        self._late_sums = _late_sums(self.comm)

    # -- per step ----------------------------------------------------------------------------
    def context(
        self,
        score: StepScore,
        candidate: OperatorCandidate | None,
        others: Sequence[OperatorCandidate] = (),
        rank: int | None = None,
    ) -> StepContext:
        """The step's facts for `candidate` (the pointed one) on its rank; `rank` names the
        rank where no candidate is given (a labelled rank whose guilty node is no candidate)."""
        if candidate is not None:
            rank = candidate.rank
        iteration = score.iteration
        row = self.row_of.get((rank, iteration)) if rank is not None else None
        rank_dur = int(self.tree.steps.dur_ns[row]) if row is not None else int(score.dur_ns)
        context = StepContext(
            iteration=iteration,
            kind=self.kind_of.get(iteration, score.kind or "step"),
            step_dur_ns=int(score.dur_ns),
            expected_ns=int(score.expected_ns),
            rank=rank,
            rank_dur_ns=rank_dur,
            ranks=len(self.ranks),
            candidate=candidate,
            others=[c for c in others if c is not candidate],
            has_logs=self.has_logs,
            unfinished=score.kind == "unfinished",
            only_step=len(self.tree.steps) <= len(self.ranks),
        )
        context.first_step = (
            rank is not None and not context.only_step and self.first_of.get(rank) == iteration
        )
        if context.unfinished:
            return context
        context.transfer = self._transfer(iteration)
        context.context_tokens, context.batch_tokens = self._tokens(iteration)
        context.held_back = self.held_back.get(iteration)
        if self.preempted is not None:
            context.preempted = self.preempted.get(iteration, 0)
        if rank is None or row is None:
            return context
        context.peers_ns, context.peer_rank = self._peers(iteration, candidate)
        context.rank_transfers = self._rank_transfers(rank, iteration)
        context.transfer_peers = self._transfer_peers(rank, iteration)
        context.arrivals = self.late_arrivals(rank, iteration)
        work = self.facts.work
        context.host = self._measured(rank, iteration, lambda k: work.host_without_waits_ns[k])
        context.gpu = self._measured(rank, iteration, lambda k: work.gpu_ns[k])
        if any(key[0] == rank for key in self.idle_of):
            context.idle = self._measured(
                rank,
                iteration,
                lambda k: self.idle_of.get((rank, int(self.tree.steps.index[k])), 0.0),
            )
        context.host_counters = self._host_counters(rank, iteration)
        context.breakdown = self._breakdowns.get((rank, iteration))
        return context

    @cached_property
    def _breakdowns(self) -> dict[tuple[int, int], StepBreakdown]:
        """(rank, iteration) → the rank's breakdown of the step (the run's one, which the
        report reads too)."""
        breakdown = breakdown_of(self.facts)
        return {(b.rank, b.step): b for b in breakdown.steps if b.step is not None}

    def _host_counters(self, rank: int, iteration: int) -> dict[str, Measured] | None:
        """Each host measure over the step against its median over the rank's normal steps of
        the kind (0 where none is known: a rank that was never throttled before)."""
        host = self.host
        if host is None or rank not in host.ranks:
            return None
        row = self.row_of[(rank, iteration)]
        normal_rows = self._normal_rows(rank, iteration)
        out = {}
        for name, values in host.added.items():
            observed = float(values[row])
            if np.isnan(observed):
                continue
            usual = values[normal_rows] if normal_rows else np.zeros(0)
            usual = usual[~np.isnan(usual)]
            out[name] = Measured(observed, float(np.median(usual)) if len(usual) else 0.0)
        return out or None

    @cached_property
    def _normal_by_kind(self) -> dict[tuple[int, str | None], list[int]]:
        """(engine, step kind) → the normal iterations of that kind, ascending."""
        out: dict[tuple[int, str | None], list[int]] = {}
        for it in sorted(self.normal):
            out.setdefault((self.engine_of.get(it, 0), self.kind_of.get(it)), []).append(it)
        return out

    def normal_like(self, iteration: int) -> list[int]:
        """The normal iterations of `iteration`'s engine and kind, itself excepted: what every
        measure of a step is compared with."""
        key = (self.engine_of.get(iteration, 0), self.kind_of.get(iteration))
        same_kind = self._normal_by_kind.get(key, [])
        return [it for it in same_kind if it != iteration]

    def _normal_rows(self, rank: int, iteration: int) -> list[int]:
        return [
            self.row_of[(rank, it)]
            for it in self.normal_like(iteration)
            if (rank, it) in self.row_of
        ]

    def _measured(self, rank: int, iteration: int, value) -> Measured | None:
        normal_rows = self._normal_rows(rank, iteration)
        if not normal_rows:
            return None
        observed = float(value(self.row_of[(rank, iteration)]))
        normal = float(np.median([float(value(k)) for k in normal_rows]))
        if observed <= 0 and normal <= 0:
            return None
        return Measured(observed, normal)

    def _peers(
        self, iteration: int, candidate: OperatorCandidate | None
    ) -> tuple[float | None, int | None]:
        """The pointed compute operator's self time on the peer ranks in this step."""
        if candidate is None or candidate.kind not in ("compute", "shift") or len(self.ranks) < 2:
            return None, None
        name = int(self.tree.name[candidate.node])
        totals = self.facts.compute_totals
        peers = [
            (r, totals[(r, name, iteration)])
            for r in self.ranks
            if r != candidate.rank and (r, name, iteration) in totals
        ]
        if not peers:
            return None, None
        value = float(np.median([t for _, t in peers]))
        return value, (peers[0][0] if len(peers) == 1 else None)

    def late_arrivals(self, rank: int, iteration: int) -> LateArrivals | None:
        """The step's collectives `rank` reached last and late, with its peers' wait there."""
        table = self.comm
        if table is None:
            return None
        mine = np.flatnonzero(
            (table.iteration == iteration) & (table.rank == rank) & table.last & (table.late_ns > 0)
        )
        if not len(mine):
            return None
        instances = table.instance[mine]
        waited = 0.0
        for i in instances.tolist():
            peers = np.flatnonzero((table.instance == i) & (table.rank != rank))
            waited += float(np.median(table.wait_ns[peers])) if len(peers) else 0.0
        sizes = table.size_bytes[mine]
        known = sizes[~np.isnan(sizes)]
        kind = Counter(table.kind[mine].tolist()).most_common(1)[0][0]
        usual = [
            self._late_sums.get((rank, it), 0.0)
            for it in self.normal_like(iteration)
            if (rank, it) in self.row_of
        ]
        return LateArrivals(
            count=len(mine),
            kind=kind,
            size_bytes=float(known.min()) if len(known) else None,
            largest_bytes=float(known.max()) if len(known) else None,
            late_ns=float(table.late_ns[mine].sum()),
            usual_late_ns=float(np.median(usual)) if usual else 0.0,
            waited_ns=waited,
            own_ns=float(table.own_ns[mine].sum()),
        )

    def lateness_and_wait(self, iterations: Collection[int]) -> dict[int, tuple[float, float]]:
        """rank → (its lateness, its wait for others), summed over the steps' collectives: in a
        lock-stepped group the straggler is late and waits little, its peers the reverse."""
        table = self.comm
        if table is None:
            return {}
        inside = np.isin(table.iteration, list(iterations))
        return {
            r: (
                float(table.late_ns[inside & (table.rank == r)].sum()),
                float(table.wait_ns[inside & (table.rank == r)].sum()),
            )
            for r in self.ranks
        }

    def _transfer(self, iteration: int) -> Measured | None:
        """The step's last arrivers' own collective time (transfer alone) against the normal
        steps of its kind."""
        if self.comm is None:
            return None
        totals = self._transfer_sums
        normal = [totals.get(it, 0.0) for it in self.normal_like(iteration)]
        observed = totals.get(iteration, 0.0)
        if not normal or observed <= 0:
            return None
        return Measured(observed, float(np.median(normal)))

    def _rank_transfers(self, rank: int, iteration: int) -> tuple[float, float] | None:
        """The rank's own collective time in the step and the median of its peers'."""
        sums = self._own_transfer_sums
        own = sums.get((rank, iteration))
        peers = [sums[(r, iteration)] for r in self._transfer_peers(rank, iteration)]
        if own is None or not peers:
            return None
        return own, float(np.median(peers))

    def _transfer_peers(self, rank: int, iteration: int) -> tuple[int, ...]:
        """The ranks other than `rank` with collective time in the step."""
        sums = self._own_transfer_sums
        return tuple(r for r in self.ranks if r != rank and (r, iteration) in sums)

    @cached_property
    def _own_transfer_sums(self) -> dict[tuple[int, int], float]:
        """(rank, iteration) → the rank's own collective time in the step, summed once for the
        run."""
        table = self.comm
        return {} if table is None else _sums_by_rank_and_step(table, table.own_ns)

    @cached_property
    def _transfer_sums(self) -> dict[int, float]:
        """Iteration → its last arrivers' own collective time, summed (once for the run: a
        mask over the whole table per normal step would make each finding scan the run once
        per step)."""
        table = self.comm
        assert table is not None
        last = table.last
        seen, row = np.unique(table.iteration[last], return_inverse=True)
        sums = np.bincount(row, weights=table.own_ns[last], minlength=len(seen))
        return dict(zip(seen.tolist(), sums.tolist(), strict=True))

    def _tokens(self, iteration: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        if not self.tokens_of or max(self.tokens_of.values()) <= 0:
            return None, None
        normal = [
            self.context_of[it] for it in self.normal_like(iteration) if it in self.context_of
        ]
        context = (
            (int(self.context_of.get(iteration, 0)), int(np.median(normal))) if normal else None
        )
        batch = (self.tokens_of.get(iteration, 0), max(self.tokens_of.values()))
        return context, batch


def _late_sums(table: _CommTable | None) -> dict[tuple[int, int], float]:
    """(rank, iteration) → its lateness where it arrived last, summed (`late_arrivals`)."""
    if table is None:
        return {}
    return _sums_by_rank_and_step(table, table.late_ns, table.last & (table.late_ns > 0))


def _sums_by_rank_and_step(
    table: _CommTable, values: np.ndarray, rows: np.ndarray | None = None
) -> dict[tuple[int, int], float]:
    """(rank, iteration) → `values` summed over the table's `rows` (a mask; all without one)."""
    if rows is not None:
        table_rank, table_iteration, values = table.rank[rows], table.iteration[rows], values[rows]
    else:
        table_rank, table_iteration = table.rank, table.iteration
    if not len(values):
        return {}
    pairs, group = np.unique(
        np.stack([table_rank, table_iteration], axis=1), axis=0, return_inverse=True
    )
    sums = np.bincount(group.ravel(), weights=values, minlength=len(pairs))
    return {(int(r), int(i)): float(v) for (r, i), v in zip(pairs, sums, strict=True)}


def _idle_totals(facts: RunFacts) -> dict[tuple[int, int], float]:
    """(rank, iteration) → GPU idle ns the host caused (`teller.localize.idle.idle_gaps`)."""
    return {key: float(sum(per_name.values())) for key, per_name in run_idle_gaps(facts).items()}


def _first_iteration_of(rank: np.ndarray, iteration: np.ndarray) -> dict[int, int]:
    """rank → the first step its capture holds (one-time set-up lands there)."""
    order = np.lexsort((iteration, rank))
    rank, iteration = rank[order], iteration[order]
    first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]]) if len(rank) else order
    return dict(zip(rank[first].tolist(), iteration[first].tolist(), strict=True))
