"""Which (rank, operator) explains a slow step: the per-step operator search.

In a proposed step, every node's self time is compared with the same operator instance (same
name and occurrence ordinal) (a) in the nearest-composition normal steps of the same rank, else
(b) on the peer ranks in the same step (a single-rank run without normal steps has neither: its
layers are compared with each other by `teller.localize.layers`). Excess self time is
summed per (rank, operator name); repeated layers add up, and self time (not inclusive time)
credits the deepest operator that actually slowed. Operators the usual work never runs (a
swapped-in kernel, a fallback path) count with their whole time; host work that kept the GPU
idle (`teller.localize.idle`) and late arrivals at collectives (`teller.localize.collectives`)
are candidates beside them.

Candidates are ranked by excess nanoseconds weighted by significance (`features.credit`): an
excess counts in full once its robust z against the same rank's totals in the reference steps
reaches `FULL_CREDIT_Z`, so large but usual noise does not outrank a consistent slowdown.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from teller.callchain.facts import Arrivals, RunFacts, StepNodes, narrowest, packed_keys
from teller.callchain.tree import CallTree
from teller.ingest.schema import COMPUTE_CODES
from teller.localize.collectives import collective_candidates
from teller.localize.features import credit, significance
from teller.localize.idle import run_idle_gaps
from teller.localize.results import OperatorCandidate, StepScore

#: Share of a rank's late arrival that its own compute excess must cover to explain it.
EXPLAINED_LATENESS = 0.5
#: Temporal reference size: this many nearest-composition normal steps.
NEAREST_STEPS = 8

#: Where an operator instance's usual self time comes from.
TEMPORAL = "nearest-composition normal steps, same rank"
PEERS = "same operator on peer ranks, same step"
#: The reference of a candidate whose operator the step's usual work does not run at all.
NEW_OPERATOR = "absent from most of the nearest normal steps, on every rank"
#: The reference of a kernel one rank runs where its tensor-parallel peers all run another.
SUBSTITUTED = "launched where the peer ranks launch another kernel, same step and position"
#: The references of operators the usual work does not run (`keep_top` keeps some of them).
FRESH = (NEW_OPERATOR, SUBSTITUTED)


@dataclass
class RunTables:
    """What every proposed step of one run is measured with, built once per run."""

    tree: CallTree
    nodes: StepNodes
    history: SelfTimeHistory
    step_totals: dict[tuple[int, int, int], float]  # (rank, name, iteration) → self ns
    gaps: dict[tuple[int, int], dict[int, float]]  # `idle_gaps`
    arrivals: Arrivals | None
    substituted: dict[int, set[tuple[int, int]]]  # `substituted_kernels`
    waiting: frozenset[int]  # name ids of calls that mostly wait: never candidates
    ranks: list[int]

    @cached_property
    def gaps_by_step(self) -> dict[int, list[tuple[int, dict[int, float]]]]:
        """`gaps` by iteration: [(rank, {name: idle ns})], in the order of `gaps`."""
        out: dict[int, list[tuple[int, dict[int, float]]]] = {}
        for (rank, iteration), per_name in self.gaps.items():
            out.setdefault(iteration, []).append((rank, per_name))
        return out

    @cached_property
    def totals_by_step(self) -> StepTotals:
        """`step_totals` indexed by iteration, built on first need (a new-operator search)."""
        return StepTotals.of(self.step_totals)

    @classmethod
    def of(cls, facts: RunFacts) -> RunTables:
        return cls(
            tree=facts.tree,
            nodes=facts.step_nodes,
            history=SelfTimeHistory.of(
                facts.step_nodes, facts.tree.steps.engine[facts.step_nodes.step]
            ),
            step_totals=facts.compute_totals,
            gaps=run_idle_gaps(facts),
            arrivals=facts.arrivals,
            substituted=substituted_kernels(facts),
            waiting=facts.waiting,
            ranks=facts.ranks,
        )


@dataclass
class SelfTimeHistory:
    """Every operator instance's self time in every step of its engine: one row per instance key
    (rank, name, ordinal, on GPU), one column per iteration of the key's engine, NaN where the
    step did not run it. A step's references are then one slice, not a lookup per node.

    One table per engine (`callchain.engines`): a rank runs its own engine's iterations only, so
    one table of every key by every iteration would be mostly NaN, and would grow as ranks ×
    engines × steps (at 64 ranks of 16 engines and 2,000 steps, 45 GB). A key whose rank ran
    steps of several engines puts the whole run in one table, as one engine would.

    The tables hold float32, half of float64's bytes for what is the localizer's largest table;
    a self time is exact in it up to 16.7 ms and within 1 ns per 16.7 ms beyond, and every
    slice is read back as float64 before medians are taken."""

    key_of: np.ndarray  # per position in `nodes`: its key's row
    blocks: list[np.ndarray]  # per engine: (its keys, its iterations) float32
    block_iterations: list[np.ndarray]  # per engine: its iterations, ascending
    first_key: np.ndarray  # per engine: its first key row (its keys are contiguous)
    engine_of: np.ndarray  # per key row: its engine's table
    # (instance: name, ordinal, on GPU) × rank → that rank's key row, -1 where it has none
    key_on_rank: np.ndarray
    instance_of: np.ndarray  # per key row: its instance
    rank_of: np.ndarray  # per key row: its rank

    @classmethod
    def of(cls, nodes: StepNodes, node_engine: np.ndarray) -> SelfTimeHistory:
        """The history of `nodes`, each of the engine `node_engine` gives it."""
        count = len(nodes.node)
        if not count:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, [], [], empty, empty, np.zeros((0, 0), np.int64), empty, empty)
        engine = np.unique(node_engine, return_inverse=True)[1].reshape(-1)
        if len(np.unique(nodes.rank)) < len(np.unique(packed_keys(engine, nodes.rank))):
            engine = np.zeros(count, dtype=np.int64)  # a rank in several engines: one table
        keys = packed_keys(engine, nodes.rank, nodes.name, nodes.ordinal, nodes.on_gpu)
        _, first, key_of = np.unique(keys, return_index=True, return_inverse=True)
        key_of = key_of.reshape(-1).astype(narrowest(len(first)))
        engine_of = engine[first]
        first_key = np.searchsorted(engine_of, np.arange(int(engine_of.max()) + 1))
        blocks, block_iterations = [], []
        for e in range(len(first_key)):
            mine = engine == e
            iterations, column = np.unique(nodes.iteration[mine], return_inverse=True)
            end = first_key[e + 1] if e + 1 < len(first_key) else len(first)
            table = np.full((end - first_key[e], len(iterations)), np.nan, dtype=np.float32)
            table[key_of[mine] - first_key[e], column.reshape(-1)] = nodes.self_ns[mine]
            blocks.append(table)
            block_iterations.append(iterations)
        instances = packed_keys(nodes.name[first], nodes.ordinal[first], nodes.on_gpu[first])
        _, instance_of = np.unique(instances, return_inverse=True)
        instance_of = instance_of.reshape(-1)
        rank_of = nodes.rank[first].astype(np.int64)
        key_on_rank = np.full((int(instance_of.max()) + 1, int(rank_of.max()) + 1), -1)
        key_on_rank[instance_of, rank_of] = np.arange(len(first))
        return cls(
            key_of,
            blocks,
            block_iterations,
            first_key,
            engine_of,
            key_on_rank,
            instance_of,
            rank_of,
        )

    def _columns(self, engine: int, iterations: list[int]) -> np.ndarray:
        """The columns of `iterations` in `engine`'s table (the others ran none of its keys)."""
        own = self.block_iterations[engine]
        wanted = np.asarray(iterations, dtype=np.int64)
        position = np.searchsorted(own, wanted)
        inside = position < len(own)
        hit = inside & (own[np.minimum(position, len(own) - 1)] == wanted)
        return position[hit]

    def medians(self, rows: np.ndarray, reference: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """For the nodes at `rows`: the median self time of their instance over the `reference`
        iterations that ran it, and how many did."""
        medians = np.full(len(rows), np.nan)
        counts = np.zeros(len(rows), dtype=np.int64)
        if not reference or not len(rows):
            return medians, counts
        keys = self.key_of[rows]
        engines = self.engine_of[keys]
        for engine in np.unique(engines).tolist():
            mine = np.flatnonzero(engines == engine)
            columns = self._columns(engine, reference)
            if not len(columns):
                continue
            local = keys[mine] - self.first_key[engine]
            # the few reference columns of the rows, not the rows' every iteration first
            values = self.blocks[engine][local[:, None], columns[None, :]].astype(np.float64)
            counts[mine] = (~np.isnan(values)).sum(axis=1)
            some = counts[mine] > 0
            if some.any():
                medians[mine[some]] = row_nanmedians(values[some])
        return medians, counts

    def peer_medians(self, rows: np.ndarray, iteration: int) -> np.ndarray:
        """For the nodes at `rows`: the median self time of the same instance on the other
        ranks in `iteration`, NaN where no peer ran it."""
        out = np.full(len(rows), np.nan)
        if not len(rows):
            return out
        keys = self.key_of[rows]
        peers = self.key_on_rank[self.instance_of[keys]]  # (rows, ranks)
        own = np.arange(peers.shape[1])[None, :] == self.rank_of[keys][:, None]
        values = np.full(peers.shape, np.nan)
        for engine in range(len(self.blocks)):  # the one whose iterations hold `iteration`
            column = self._columns(engine, [iteration])
            if not len(column):
                continue
            ran = (peers >= 0) & ~own & (self.engine_of[np.maximum(peers, 0)] == engine)
            local = np.where(ran, peers - self.first_key[engine], 0)
            values = np.where(ran, self.blocks[engine][local, column[0]].astype(np.float64), values)
        some = (~np.isnan(values)).any(axis=1)
        if some.any():
            out[some] = row_nanmedians(values[some])
        return out


def row_nanmedians(values: np.ndarray) -> np.ndarray:
    """Each row's median over its values that are not NaN (every row has one), as
    `np.nanmedian(values, axis=1)` gives it: that goes through masked arrays for narrow
    tables, and the localizer asks it for a few columns of thousands of rows per step."""
    ordered = np.sort(values, axis=1)  # NaN sorts last
    count = (~np.isnan(values)).sum(axis=1)
    rows = np.arange(len(values))
    return (ordered[rows, (count - 1) // 2] + ordered[rows, count // 2]) / 2


#: The run's facts keep its `RunTables` under this name, for every scoring of the run to share.
CANDIDATE_TABLES = "candidate_tables"
#: What the scorings of a run share and nothing after them reads (`RunFacts.release`): each
#: step's nodes keyed, and the candidate tables built on them.
SCORING_TABLES = ("step_nodes", CANDIDATE_TABLES)


def propose(
    facts: RunFacts,
    proposed: set[int],
    steps: list[StepScore],
    top_k: int,
    noise_floor_ns: float,
) -> dict[int, list[OperatorCandidate]]:
    """Ranked candidates of every `proposed` iteration, each measured against its nearest
    normal (not anomalous) steps of the same kind."""
    tree = facts.tree
    kind_of = {s.iteration: s.kind for s in steps}
    tokens_of = {
        int(tree.steps.index[k]): float(
            max(tree.steps.context_tokens[k], 0) + max(tree.steps.generation_tokens[k], 0)
        )
        for k in range(len(tree.steps))
    }
    # a step's references are its own engine's steps (`callchain.engines`): only those ran on
    # its ranks
    iterations = facts.iterations
    engine_of = dict(zip(iterations.iteration.tolist(), iterations.engine.tolist(), strict=True))
    normal_of_engine: dict[int, list[int]] = {}
    for s in steps:
        if not s.anomalous:
            normal_of_engine.setdefault(engine_of.get(s.iteration, 0), []).append(s.iteration)
    tables = facts.derived(CANDIDATE_TABLES, lambda: RunTables.of(facts))
    nearest = {
        engine: NearestSteps(normal, kind_of, tokens_of)
        for engine, normal in normal_of_engine.items()
    }
    out: dict[int, list[OperatorCandidate]] = {}
    for iteration in sorted(proposed):
        engine = engine_of.get(iteration, 0)
        reference = (
            nearest[engine].of(iteration, kind_of.get(iteration), tokens_of.get(iteration, 0.0))
            if engine in nearest
            else []
        )
        out[iteration] = step_candidates(tables, iteration, reference, top_k, noise_floor_ns)
    return out


def step_candidates(
    tables: RunTables,
    iteration: int,
    reference: list[int],
    top_k: int,
    noise_floor_ns: float,
) -> list[OperatorCandidate]:
    """One step's candidates, best first (`keep_top` of them)."""
    tree, nodes, waiting = tables.tree, tables.nodes, tables.waiting
    candidates = _operator_excess(tables, iteration, reference, noise_floor_ns)
    new = (
        _new_operators(tables.totals_by_step, iteration, reference, waiting, noise_floor_ns)
        if reference
        else []
    )
    seen = {key for key, _ in new}
    found = [(key, observed, NEW_OPERATOR) for key, observed in new]
    for rank, name in sorted(tables.substituted.get(iteration, set()) - seen):
        observed = tables.step_totals.get((rank, name, iteration), 0.0)
        if observed > noise_floor_ns and name not in waiting:
            found.append(((rank, name), observed, SUBSTITUTED))
    # an operator the usual work does not run was measured above against the few steps that
    # did (the fault's own unflagged steps, or all of them once it persists): its whole time
    # is the excess instead
    fresh = {(rank, tree.names[name]) for (rank, name), _, _ in found}
    candidates = [c for c in candidates if (c.rank, c.operator) not in fresh]
    for (rank, name), observed, why in found:
        candidates.append(
            OperatorCandidate(
                iteration=iteration,
                rank=rank,
                operator=tree.names[name],
                score=observed,
                observed_ns=int(observed),
                normal_ns=0,
                z=significance(observed, [], noise_floor_ns),
                node=int(nodes.node[nodes.largest(iteration, rank, name)]),
                reference=why,
                kind="compute",
            )
        )
    candidates.extend(_idle_candidates(tables, iteration, reference, noise_floor_ns))
    compute_excess: dict[int, float] = {}
    for candidate in candidates:
        compute_excess[candidate.rank] = compute_excess.get(candidate.rank, 0.0) + candidate.score
    collectives = collective_candidates(tree, tables.arrivals, iteration, reference, noise_floor_ns)
    for candidate in collectives:
        explained = compute_excess.get(candidate.rank, 0.0)
        if candidate.kind == "arrival":
            # a rank whose own work got slower arrives late *because* of it: when its compute
            # excess explains most of the lateness, the collective is a symptom, not a cause
            if explained >= EXPLAINED_LATENESS * candidate.score:
                continue
            candidate.score -= explained
        elif candidate.kind == "transfer" and explained >= candidate.score:
            # a host-run collective (gloo) on a slowed host is slow for the host's reason
            continue
        if candidate.score > noise_floor_ns:
            candidates.append(candidate)
    candidates.sort(key=lambda c: -c.score)
    return keep_top(candidates, top_k)


def _operator_excess(
    tables: RunTables, iteration: int, reference: list[int], noise_floor_ns: float
) -> list[OperatorCandidate]:
    """Per (rank, operator) of the step: its nodes' self time beyond their reference, summed.

    A node's reference is the same instance in the reference steps where at least two ran it,
    else on the peer ranks in this step; a node with neither is left to the layer comparison."""
    tree, nodes = tables.tree, tables.nodes
    rows = nodes.rows_in(iteration)
    rows = rows[
        np.isin(nodes.layer[rows], list(COMPUTE_CODES))
        & ~np.isin(nodes.name[rows], list(tables.waiting))
    ]
    normal, counts = tables.history.medians(rows, reference)
    temporal = counts >= 2
    peer_rows = np.flatnonzero(~temporal)  # no temporal reference: the peers in this step
    normal[peer_rows] = tables.history.peer_medians(rows[peer_rows], iteration)
    kept = ~np.isnan(normal)
    rows, normal, temporal = rows[kept], normal[kept], temporal[kept]
    if not len(rows):
        return []
    observed = nodes.self_ns[rows].astype(np.int64)
    excess = observed.astype(np.float64) - normal  # small and negative ones too: they add up
    pair = nodes.rank[rows].astype(np.int64) * len(tree.names) + nodes.name[rows]
    _, first, group = np.unique(pair, return_index=True, return_inverse=True)
    group = group.reshape(-1)
    excess_sum = np.bincount(group, weights=excess)
    observed_sum = np.bincount(group, weights=observed)
    normal_sum = np.bincount(group, weights=np.trunc(normal))
    # the node that contributed most (the first of equals), or the first where none exceeded
    order = np.lexsort((np.arange(len(rows)), -excess, group))
    leaders = order[np.concatenate([[0], np.flatnonzero(np.diff(group[order])) + 1])]
    best = np.where(excess[leaders] > 0.0, leaders, first)
    candidates = []
    for g in np.argsort(first, kind="stable").tolist():
        if excess_sum[g] <= noise_floor_ns:
            continue
        head = int(first[g])
        rank, name = int(nodes.rank[rows[head]]), int(nodes.name[rows[head]])
        usual = [tables.step_totals.get((rank, name, r), 0.0) for r in reference]
        z = significance(float(observed_sum[g]), usual, noise_floor_ns)
        candidates.append(
            OperatorCandidate(
                iteration,
                rank,
                tree.names[name],
                score=float(excess_sum[g]) * credit(z),
                observed_ns=int(observed_sum[g]),
                normal_ns=int(normal_sum[g]),
                z=z,
                node=int(nodes.node[rows[best[g]]]),
                reference=TEMPORAL if temporal[head] else PEERS,
                kind="compute",
            )
        )
    return candidates


def _idle_candidates(
    tables: RunTables, iteration: int, reference: list[int], noise_floor_ns: float
) -> list[OperatorCandidate]:
    """Host work that kept a rank's GPU idle longer than in the nearest normal steps.

    Which host node a gap lands on wanders from step to step, so the evidence is judged per
    rank first: only when the rank's total idle time is itself unusual do its per-operator
    shares get credit."""
    tree, nodes, gaps = tables.tree, tables.nodes, tables.gaps
    out: list[OperatorCandidate] = []
    if not reference:  # no step to say how long the GPU usually waits here
        return out
    for rank, per_name in tables.gaps_by_step.get(iteration, []):
        usual_totals = [sum(gaps.get((rank, r), {}).values()) for r in reference]
        rank_z = significance(sum(per_name.values()), usual_totals, noise_floor_ns)
        weight = credit(rank_z)
        if weight <= 0.0:
            continue
        for name, idle in per_name.items():
            usual = [gaps.get((rank, r), {}).get(name, 0.0) for r in reference]
            excess = idle - (float(np.median(usual)) if usual else 0.0)
            if excess <= noise_floor_ns:
                continue
            largest = nodes.largest(iteration, rank, name)
            if largest < 0:
                continue
            out.append(
                OperatorCandidate(
                    iteration=iteration,
                    rank=rank,
                    operator=tree.names[name],
                    score=excess * weight,
                    observed_ns=int(idle),
                    normal_ns=int(np.median(usual)) if usual else 0,
                    z=rank_z,
                    node=int(nodes.node[largest]),
                    reference="GPU idle while this host work delayed the next launch, "
                    "vs nearest normal steps",
                    kind="idle",
                )
            )
    return out


@dataclass
class StepTotals:
    """`RunFacts.compute_totals` by iteration: the names each step ran, and its (rank, name)
    totals in the order of the run's table."""

    names: dict[int, set[int]]
    rows: dict[int, list[tuple[tuple[int, int], float]]]

    @classmethod
    def of(cls, step_totals: dict[tuple[int, int, int], float]) -> StepTotals:
        names: dict[int, set[int]] = {}
        rows: dict[int, list[tuple[tuple[int, int], float]]] = {}
        for (rank, name, iteration), total in step_totals.items():
            names.setdefault(iteration, set()).add(name)
            rows.setdefault(iteration, []).append(((rank, name), total))
        return cls(names, rows)


def _new_operators(
    totals: StepTotals,
    iteration: int,
    reference: list[int],
    waiting: frozenset[int],
    noise_floor_ns: float,
) -> list[tuple[tuple[int, int], float]]:
    """(rank, name) whose work in this step is absent from most reference steps, on every
    rank: a swapped-in kernel, a fallback path. Their whole time is excess.

    Most, not all: the reference steps are the ones the step scores did not flag, and a
    fault that slows a step less than its batch's spread leaves some of its own steps among
    them. One such step in the reference must not make the swapped kernel usual."""
    references = set(reference)
    steps_with = Counter(n for it in references for n in totals.names.get(it, ()))
    usual_names = {n for n, count in steps_with.items() if 2 * count > len(references)}
    return [
        ((r, n), total)
        for (r, n), total in totals.rows.get(iteration, [])
        if total > noise_floor_ns and n not in usual_names and n not in waiting
    ]


def substituted_kernels(facts: RunFacts) -> dict[int, set[tuple[int, int]]]:
    """iteration → (rank, kernel name id) of kernels one rank launched where every other rank of
    the step, at the same position of the same-length kernel sequence, launched one other kernel.

    Why: the ranks of a tensor-parallel group launch the same kernels in the same order, so a
    kernel that one rank alone runs in a peer's place is a substitution (a fallback GEMM, a
    regressed path), whether or not earlier steps ran it too: history cannot see a regression
    that has lasted, the peers can. Needs three ranks of one sequence length (with two, neither
    is the odd one out); pipeline stages, whose sequences differ, never compare."""
    tree = facts.tree
    out: dict[int, set[tuple[int, int]]] = {}
    for iteration, sequences in facts.kernel_sequences.items():
        by_length: dict[int, list[tuple[int, np.ndarray]]] = {}
        for k, rows in sequences:
            by_length.setdefault(len(rows), []).append((k, rows))
        for length, group in by_length.items():
            if length == 0 or len(group) < 3:
                continue
            names = np.stack([tree.name[rows] for _, rows in group])
            for g, (k, _) in enumerate(group):
                others = np.delete(names, g, axis=0)
                odd = (others != names[g]).all(axis=0) & (others == others[0]).all(axis=0)
                rank = int(tree.steps.rank[k])
                for name in np.unique(names[g][odd]).tolist():
                    out.setdefault(iteration, set()).add((rank, int(name)))
    return out


def keep_top(candidates: list[OperatorCandidate], k: int) -> list[OperatorCandidate]:
    """The first k of candidates ranked best first, in their order, except that up to k // 2
    new operators stay whatever their place, in place of the last others.

    Why: a swapped-in kernel's whole time is its excess, often less than an idle gap elsewhere in
    a noisy step, yet an operator the usual work never runs is the strongest structural evidence
    a step has; cut by rank alone, it would never reach the pointer that weighs it."""
    fresh = [i for i, c in enumerate(candidates) if c.reference in FRESH][: k // 2]
    others = [i for i, c in enumerate(candidates) if c.reference not in FRESH]
    kept = sorted(fresh + others[: max(k - len(fresh), 0)])
    return [candidates[i] for i in kept]


class NearestSteps:
    """An engine's normal steps, for each step to find the `NEAREST_STEPS` most like it: the
    same kind where there are any, then the closest in tokens, then in time. Held as arrays
    because every step of a run asks (the model's records propose candidates on all of them),
    and sorting the engine's normal steps in Python for each made that quadratic in steps."""

    def __init__(
        self, normal: list[int], kind_of: dict[int, str], tokens_of: dict[int, float]
    ) -> None:
        self.iterations = np.asarray(normal, dtype=np.int64)
        self.kind_code = {kind: code for code, kind in enumerate(dict.fromkeys(kind_of.values()))}
        self.kinds = np.asarray(
            [self.kind_code.get(kind_of.get(n), -1) for n in normal], dtype=np.int64
        )
        self.tokens = np.asarray([tokens_of.get(n, 0.0) for n in normal], dtype=np.float64)

    def of(self, iteration: int, kind: str | None, tokens: float) -> list[int]:
        """The nearest normal steps to `iteration` (a step proposed while normal is not its
        own reference), nearest first; equals keep the order the steps were given in."""
        other = self.iterations != iteration
        same_kind = other & (self.kinds == self.kind_code.get(kind, -2))
        chosen = same_kind if same_kind.any() else other
        iterations = self.iterations[chosen]
        order = np.lexsort((np.abs(iterations - iteration), np.abs(self.tokens[chosen] - tokens)))
        return iterations[order[:NEAREST_STEPS]].tolist()


def _small_median(values: list[int]) -> float:
    """The median of a short list. Why not np.median: candidates take one per operator instance
    per step, and on lists this short its array overhead outweighs the work."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return float(ordered[half]) if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2.0
