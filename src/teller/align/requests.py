"""Request trees: each request's root and the engine steps it was batched in (DESIGN.md §2).

A request tree is the request plus every step that worked on it; co-batched requests share that
step's subtree on every rank. Engines rarely say which requests a step ran, so membership is
inferred from what each request's own records bound:

* OTel `llm_request` spans: scheduled at arrival + queue time, first token at arrival + TTFT,
  finished at arrival + e2e (ns-exact);
* log lines: `Added`/`Received` (arrival) and `Finished` (finish) per request key (exact with the
  collector prefix, else to the second).

Every step (on the reference rank) that overlaps the request's [scheduled, finished] window is a
candidate; the first is its prefill step. Steps that state how many requests they ran give each
membership a confidence: N + M over the number of candidate requests for that step, capped at 1 —
a step that ran 3 requests while 6 lifetimes overlap it gets 0.5 for each. The counts come from the
step's annotation (vLLM's `execute_context_N(…)_generation_M(…)`, the lab's), else from the
iteration line anchored to the step (`N context requests, … M generation requests`). Without any
of this a request keeps only its lifetime.

A queued request is in no step until one admits it, so where the counts and exact arrivals allow,
the queue is replayed first-come-first-served over each step's new admissions (its context
requests less continuing chunked prefills and resumed recomputes); a span's scheduled time names
its step outright. A request the replay admits in no traced step, with no record of finishing, was
still queued when the trace ended: it gets no steps (`RequestTrees.queued`). The replay assumes
the trace covers the run from its first step: requests admitted before it would take slots.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from teller.align.logtime import LogTimes, engine_groups
from teller.callchain.steps import StepTable
from teller.callchain.tree import CallTree
from teller.ingest.logs.table import LogTable, request_key
from teller.ingest.otlp import RequestTable

#: How far an exact request window may miss a step and still be in it (timer granularity, the
#: gap between a step ending and its `Finished` line).
WINDOW_SLACK_NS = 1_000_000
#: How late a request's arrival line may be stamped after the step that admitted it started. A
#: collector stamps a line when its tee reads the pipe, and on a loaded host that comes up to tens
#: of ms after the engine printed it, just before the step. Measured on the 18 real lab cases of
#: evalsets/lab-eval-v1.json (recorded under load): Added lines on their admission step 564/934
#: at 1 ms, 855/934 at 5 ms, 934/934 at 10 and 20 ms.
ARRIVAL_SLACK_NS = 20_000_000
#: The same for times printed to the second: the true time is anywhere in that second.
INEXACT_SLACK_NS = 1_000_000_000
#: Log times (see teller.align.logtime) that bound a record tightly enough to count as exact.
PLACED = frozenset({"exact", "anchor", "order"})
#: `_admit_first_come_first_served`'s mark for a request the replay admitted in no traced step.
NEVER_ADMITTED = -2
#: Share of the run's largest step (in tokens) under which a step still had token budget left.
TOKEN_ROOM = 0.8
#: vLLM's context detail `context_N(sq<query tokens>sk<key tokens>…)`: key beyond query tokens
#: means a request's earlier tokens were already computed.
_QUERY_KEY_TOKENS = re.compile(r"context_\d+\(sq(\d+)sk(\d+)")


@dataclass
class Requests:
    """One row per request: its key and the times that bound which steps served it (-1 unknown)."""

    key: list[str]
    arrival_ns: np.ndarray
    scheduled_ns: np.ndarray
    first_token_ns: np.ndarray
    finish_ns: np.ndarray
    exact: np.ndarray  # bool: times are ns-exact (OTel, collector prefix) rather than to the second
    source: list[str]  # "otel" | "logs"

    def __len__(self) -> int:
        return len(self.key)

    def to_arrow(self) -> pa.Table:
        return pa.table(
            {
                "request_key": self.key,
                "arrival_ns": self.arrival_ns,
                "scheduled_ns": self.scheduled_ns,
                "first_token_ns": self.first_token_ns,
                "finish_ns": self.finish_ns,
                "exact": self.exact,
                "source": self.source,
            }
        )


@dataclass
class RequestTrees:
    """Requests and their (request, step) memberships, struct-of-arrays.

    `step` is the step ordinal (`tree.steps.index`), the same iteration on every rank;
    `step_row` the row of that step on the reference rank in `tree.steps`.
    """

    requests: Requests
    request: np.ndarray  # index into `requests`, one entry per membership
    step: np.ndarray
    step_row: np.ndarray
    phase: list[str]  # "prefill" | "decode"
    confidence: np.ndarray
    reference_rank: int
    queued: list[str] = field(default_factory=list)  # keys of requests no traced step admitted
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.request)

    def steps_of(self, key: str) -> list[int]:
        """Step ordinals the request with this key was batched in, in order."""
        try:
            index = self.requests.key.index(key)
        except ValueError:
            return []
        return sorted(self.step[self.request == index].tolist())

    def waiting(self, tree: CallTree) -> dict[int, int]:
        """Step ordinal → requests that had arrived by the step's start (reference rank), had not
        finished by then, and that no step up to it had admitted: the queue the scheduler left
        waiting.

        Only requests with ns-exact arrivals count (a log stamp to the second says nothing about
        a step of milliseconds); a run without any gets no queue at all. A capture taken from a
        running service holds requests whose admission it missed (only their finish was logged,
        so their arrival is unknown) and requests served wholly between two captures; no traced
        step admits either, and neither was waiting."""
        requests = self.requests
        if not requests.exact.any():
            return {}
        never = np.iinfo(np.int64).max
        known = requests.exact & (requests.arrival_ns >= 0)
        first = np.full(len(requests), never)
        np.minimum.at(first, self.request, self.step)
        steps = tree.steps
        rows = np.flatnonzero(steps.rank == self.reference_rank)
        arrival = requests.arrival_ns[known]
        finish = np.where(requests.finish_ns[known] >= 0, requests.finish_ns[known], never)
        admitted = first[known]
        return {
            int(steps.index[row]): int(
                np.count_nonzero(
                    (arrival <= steps.start_ns[row])
                    & (finish > steps.start_ns[row])
                    & (admitted > steps.index[row])
                )
            )
            for row in rows.tolist()
        }

    def step_subtrees(self, key: str, tree: CallTree) -> pa.Table:
        """The request's tree: one row per (step, rank) of its steps, with the node that roots
        that rank's subtree of the step (co-batched requests share it), in step then rank order."""
        steps = tree.steps
        rows = np.flatnonzero(np.isin(steps.index, self.steps_of(key)))
        rows = rows[np.lexsort((steps.rank[rows], steps.index[rows]))]
        return pa.table(
            {
                "step": pa.array(steps.index[rows], pa.int64()),
                "rank": pa.array(steps.rank[rows], pa.int32()),
                "node": pa.array(steps.node[rows], pa.int64()),
            }
        )

    def to_arrow(self) -> pa.Table:
        return pa.table(
            {
                "request_key": [self.requests.key[i] for i in self.request.tolist()],
                "step": self.step,
                "phase": self.phase,
                "confidence": self.confidence,
            }
        )


def collect_requests(
    logs: LogTable | None = None,
    spans: RequestTable | None = None,
    times: LogTimes | None = None,
) -> Requests:
    """Every request the spans or logs mention, with its bounding times (spans win when both).

    With `times` (log records placed on the trace clock) a request's arrival is the earliest its
    admission lines can have been printed and its finish the latest; without, the printed times.
    """
    rows: dict[str, dict] = {}
    if logs is not None and len(logs):
        table = logs.table
        keys = table.column("request_key").to_pylist()
        events = table.column("event").to_pylist()
        if times is not None:
            early, late = times.lo_ns.tolist(), times.hi_ns.tolist()
            exact = [h in PLACED for h in times.how]
        else:
            early = late = table.column("ts_ns").to_pylist()
            exact = table.column("ts_exact").to_pylist()
        for i, (key, event) in enumerate(zip(keys, events, strict=True)):
            if key is None or early[i] < 0:
                continue
            row = rows.setdefault(key, _blank("logs", len(rows)))
            row["exact"] = row["exact"] and exact[i]
            if event in ("request_received", "request_added"):
                if row["arrival_ns"] < 0 or early[i] < row["arrival_ns"]:
                    row["arrival_ns"] = early[i]
            elif event in ("request_finished", "request_aborted"):
                row["finish_ns"] = max(row["finish_ns"], late[i])
    if spans is not None and len(spans):
        log_keys = frozenset(rows)
        for span in spans.table.to_pylist():
            arrival = span["arrival_ns"]
            # a span may carry V1's engine id for an API id only the logs printed
            key = request_key(span["request_key"], log_keys)
            row = rows.setdefault(key, _blank("otel", len(rows)))
            row.update(source="otel", exact=True, arrival_ns=arrival)
            row["scheduled_ns"] = arrival + span["queue_ns"] if span["queue_ns"] >= 0 else -1
            row["first_token_ns"] = arrival + span["ttft_ns"] if span["ttft_ns"] >= 0 else -1
            row["finish_ns"] = arrival + span["e2e_ns"] if span["e2e_ns"] >= 0 else span["end_ns"]
    # equal arrival bounds (lines bracketed by the same anchors) keep their order of appearance
    keys = sorted(rows, key=lambda k: (rows[k]["arrival_ns"], rows[k]["order"]))

    def column(name: str) -> np.ndarray:
        return np.asarray([rows[k][name] for k in keys], dtype=np.int64)

    return Requests(
        key=keys,
        arrival_ns=column("arrival_ns"),
        scheduled_ns=column("scheduled_ns"),
        first_token_ns=column("first_token_ns"),
        finish_ns=column("finish_ns"),
        exact=np.asarray([rows[k]["exact"] for k in keys], dtype=bool),
        source=[rows[k]["source"] for k in keys],
    )


def build_request_trees(
    tree: CallTree,
    logs: LogTable | None = None,
    spans: RequestTable | None = None,
    reference_rank: int | None = None,
    times: LogTimes | None = None,
) -> RequestTrees:
    """Attach every request to the steps (of `reference_rank`, default the lowest) it ran in.

    `tree` and `spans` must be on one clock (see `teller.align.clock`); log times are taken as
    printed unless `times` (`teller.align.logtime.place_log_times`) puts them on the trace clock;
    `times` also ties iteration lines to their steps, whose printed request counts stand in for
    an annotation that states none. In a run of several engines, a request whose lines name its
    engine (`times.engine`) is attached to that engine's steps, on its lowest rank.
    """
    requests = collect_requests(logs, spans, times)
    steps = tree.steps
    warnings: list[str] = []
    ranks = sorted(set(steps.rank.tolist()))
    if reference_rank is None:
        reference_rank = ranks[0] if ranks else 0
    begins = np.where(requests.scheduled_ns >= 0, requests.scheduled_ns, requests.arrival_ns)
    # arrived but never finished in the records: still in flight when the trace ended
    in_flight = (begins >= 0) & (requests.finish_ns < 0)
    finishes = np.where(in_flight, np.iinfo(np.int64).max // 2, requests.finish_ns)
    complete = (begins >= 0) & (finishes >= 0)
    incomplete = int(np.count_nonzero(~complete))
    request_engine, record_engine = _request_engines(requests, logs, times)
    queued = np.zeros(len(requests), dtype=bool)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]] = []
    for engine, rank in engine_groups(request_engine, tree, reference_rank):
        rows = np.flatnonzero(steps.rank == rank)
        rows = rows[np.argsort(steps.start_ns[rows], kind="stable")]
        mine = request_engine == engine
        group_logs = (
            logs if logs is None or engine < 0 else _records_of(logs, record_engine, engine)
        )
        group_times = times if group_logs is logs else _times_of(times, record_engine, engine)
        part = _attach(
            steps,
            rows,
            requests,
            mine,
            begins,
            finishes,
            complete,
            in_flight,
            group_logs,
            group_times,
        )
        queued |= part[-1]
        parts.append((rows, *part[:-1]))
        if len(rows) == 0:
            warnings.append(f"rank {rank} has no steps: requests keep only their lifetimes")
    if incomplete:
        warnings.append(f"{incomplete} requests have no arrival time: no steps attached")
    if (in_flight & ~queued).any():
        warnings.append(
            f"{int((in_flight & ~queued).sum())} requests never finish in the records: attached "
            "up to the last traced step (still in flight)"
        )
    if queued.any():
        warnings.append(
            f"{int(queued.sum())} requests were never admitted in the traced steps (still queued)"
        )
    empty = np.zeros(0, dtype=np.int64)
    request = np.concatenate([part[1] for part in parts] or [empty])
    step_row = np.concatenate([part[0][part[2]] for part in parts] or [empty])
    return RequestTrees(
        requests=requests,
        request=request,
        step=steps.index[step_row] if len(step_row) else empty,
        step_row=step_row,
        phase=[phase for part in parts for phase in part[4]],
        confidence=np.concatenate([part[3] for part in parts] or [np.zeros(0)]),
        reference_rank=reference_rank,
        queued=[requests.key[i] for i in np.flatnonzero(queued).tolist()],
        warnings=warnings,
    )


def _attach(
    steps: StepTable,
    rows: np.ndarray,
    requests: Requests,
    mine: np.ndarray,
    begins: np.ndarray,
    finishes: np.ndarray,
    complete: np.ndarray,
    in_flight: np.ndarray,
    logs: LogTable | None,
    times: LogTimes | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], np.ndarray]:
    """The requests `mine` on the steps `rows` (one rank's, in time order): per membership the
    request, its position in `rows`, confidence and phase; and which of them stayed queued."""
    starts, ends = steps.start_ns[rows], steps.start_ns[rows] + steps.dur_ns[rows]
    context, generation = _stated_counts(steps, rows, logs, times)
    stated = np.where((context < 0) | (generation < 0), -1, context + generation)
    slots = _admission_slots(steps, rows, ends, context, logs, times)
    admitted = _admit_first_come_first_served(requests, begins, complete & mine, starts, slots)
    # replayed and never admitted, and no record of it finishing: still queued at the trace's end
    queued = (admitted == NEVER_ADMITTED) & in_flight & mine
    member_request: list[int] = []
    member_pos: list[int] = []
    for i in np.flatnonzero(complete & ~queued & mine).tolist():
        begin, finish = int(begins[i]), int(finishes[i])
        if requests.exact[i]:
            # a step already running when the request arrived cannot include it, and the step
            # that produced its last token ended just before it finished
            first = int(np.searchsorted(starts, begin - WINDOW_SLACK_NS, side="left"))
            last = int(np.searchsorted(ends, finish + WINDOW_SLACK_NS, side="right"))
            # the replayed admission decides (a span's scheduled time is exact: it wins), as
            # late as the queue kept it and as early as a late-stamped arrival line allows
            earliest = int(np.searchsorted(starts, begin - ARRIVAL_SLACK_NS, side="left"))
            if requests.scheduled_ns[i] < 0 and admitted[i] >= earliest:
                first = int(admitted[i])
        else:  # times to the second: any step the second may overlap
            first = int(np.searchsorted(ends, begin - INEXACT_SLACK_NS, side="right"))
            last = int(np.searchsorted(starts, finish + INEXACT_SLACK_NS, side="left"))
        for pos in range(first, last):
            member_request.append(i)
            member_pos.append(pos)
    request = np.asarray(member_request, dtype=np.int64)
    pos = np.asarray(member_pos, dtype=np.int64)
    candidates = np.bincount(pos, minlength=len(rows)) if len(pos) else np.zeros(len(rows), int)
    confidence = np.ones(len(pos), dtype=np.float64)
    if len(pos):
        has_count = stated[pos] >= 0
        ratio = stated[pos] / np.maximum(candidates[pos], 1)
        confidence = np.where(has_count, np.minimum(ratio, 1.0), 0.5)
    phase = _phases(request, pos, requests, starts, ends)
    return request, pos, confidence, phase, queued


def _request_engines(
    requests: Requests, logs: LogTable | None, times: LogTimes | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per request the engine its log lines name most (-1: none, or a run of one engine), and
    per log record its own (`times.engine`)."""
    request_engine = np.full(len(requests), -1, dtype=np.int64)
    if logs is None or times is None or times.engine is None or not (times.engine >= 0).any():
        return request_engine, np.full(len(logs) if logs is not None else 0, -1, dtype=np.int64)
    votes: dict[str, Counter[int]] = {}
    for key, engine in zip(
        logs.table.column("request_key").to_pylist(), times.engine.tolist(), strict=True
    ):
        if key is not None and engine >= 0:
            votes.setdefault(key, Counter())[engine] += 1
    for i, key in enumerate(requests.key):
        if key in votes:
            request_engine[i] = votes[key].most_common(1)[0][0]
    return request_engine, times.engine


def _records_of(logs: LogTable, record_engine: np.ndarray, engine: int) -> LogTable:
    """The log records of one engine (its iteration lines state its steps' batches)."""
    return replace(logs, table=logs.table.filter(pa.array(record_engine == engine)))


def _times_of(times: LogTimes | None, record_engine: np.ndarray, engine: int) -> LogTimes | None:
    if times is None:
        return None
    keep = record_engine == engine
    return replace(
        times,
        lo_ns=times.lo_ns[keep],
        hi_ns=times.hi_ns[keep],
        how=[h for h, k in zip(times.how, keep.tolist(), strict=True) if k],
        anchor_step=times.anchor_step[keep],
        engine=times.engine[keep] if times.engine is not None else None,
    )


def _stated_counts(
    steps: StepTable, rows: np.ndarray, logs: LogTable | None, times: LogTimes | None
) -> tuple[np.ndarray, np.ndarray]:
    """(context, generation) requests each step of `rows` ran, -1 unknown: as its annotation
    states, else as the iteration line anchored to it prints."""
    context = steps.context_requests[rows].copy()
    generation = steps.generation_requests[rows].copy()
    if logs is None or times is None or not ((context < 0) | (generation < 0)).any():
        return context, generation
    position = {int(o): p for p, o in enumerate(steps.index[rows].tolist())}
    printed_context = logs.table.column("context_requests").to_pylist()
    printed_generation = logs.table.column("generation_requests").to_pylist()
    for i in np.flatnonzero(times.anchor_step >= 0).tolist():
        pos = position.get(int(times.anchor_step[i]))
        if pos is None:
            continue
        for counts, printed in ((context, printed_context), (generation, printed_generation)):
            if counts[pos] < 0 and printed[i] is not None:
                counts[pos] = printed[i]
    return context, generation


def _admission_slots(
    steps: StepTable,
    rows: np.ndarray,
    ends: np.ndarray,
    context: np.ndarray,
    logs: LogTable | None,
    times: LogTimes | None,
) -> np.ndarray:
    """How many new requests each step of `rows` admitted: its context requests less the ones
    that are not new, -1 unknown.

    Two kinds of context request were admitted before: a chunked prefill continuing from the
    step before, which vLLM's annotation shows as more key than query tokens (`sk` > `sq`; the
    scheduler leaves at most one prefill part-done), and a preempted request recomputing its
    tokens, whose `has been resumed` line is printed as the step is scheduled.
    """
    slots = context.astype(np.int64).copy()
    for pos, row in enumerate(rows.tolist()):
        if (match := _QUERY_KEY_TOKENS.search(steps.name[row])) and int(match[2]) > int(match[1]):
            slots[pos] -= 1
    if logs is not None and len(logs) and len(ends):
        resumed = pc.fill_null(pc.equal(logs.table.column("event"), "request_resumed"), False)
        exact = logs.table.column("ts_exact")
        for i in np.flatnonzero(resumed.to_numpy(zero_copy_only=False)).tolist():
            if times is not None:
                when, placed = times.hi_ns[i], times.how[i] in PLACED
            else:
                when, placed = logs.table.column("ts_ns")[i].as_py(), exact[i].as_py()
            if placed and when >= 0:
                pos = int(np.searchsorted(ends, when, side="left"))  # the step it precedes
                if pos < len(slots):
                    slots[pos] -= 1
    return np.where(context < 0, -1, np.maximum(slots, 0))


def _admit_first_come_first_served(
    requests: Requests,
    begins: np.ndarray,
    complete: np.ndarray,
    starts: np.ndarray,
    slots: np.ndarray,
) -> np.ndarray:
    """Position of each request's admission step; NEVER_ADMITTED where the replay admitted it in
    no traced step, -1 where it cannot be told.

    A request that waits in the queue is in no step until one admits it: with exact times and
    steps that state how many new requests they took (`_admission_slots`), the queue is replayed
    in arrival order (vLLM's default first-come-first-served policy): each step admits that many
    of the requests that had arrived before it started. A span's scheduled time names its step
    outright; that request takes one of the step's slots and the replay fills the rest.
    """
    admitted = np.full(len(requests), -1, dtype=np.int64)
    if len(slots) == 0 or (slots < 0).any():
        return admitted
    slots = slots.copy()
    order = []
    for i in np.argsort(begins, kind="stable").tolist():
        if not (complete[i] and requests.exact[i]):
            continue
        if requests.scheduled_ns[i] >= 0:
            pos = int(np.searchsorted(starts, requests.scheduled_ns[i] - WINDOW_SLACK_NS))
            if pos < len(slots):
                admitted[i] = pos
                slots[pos] = max(slots[pos] - 1, 0)
            continue
        admitted[i] = NEVER_ADMITTED
        order.append(i)
    waiting = 0  # index into `order` of the first request not yet admitted
    for pos in range(len(slots)):
        take = int(slots[pos])
        while take and waiting < len(order):
            i = order[waiting]
            if begins[i] > starts[pos] + ARRIVAL_SLACK_NS:
                break  # not arrived yet: the step's other slots went to requests we cannot see
            admitted[i] = pos
            waiting += 1
            take -= 1
    return admitted


def _phases(
    request: np.ndarray,
    pos: np.ndarray,
    requests: Requests,
    starts: np.ndarray,
    ends: np.ndarray,
) -> list[str]:
    """Prefill for the step that produced the first token (else the request's first step)."""
    phase = ["decode"] * len(request)
    first_seen: dict[int, int] = {}
    for k, (i, p) in enumerate(zip(request.tolist(), pos.tolist(), strict=True)):
        first_token = requests.first_token_ns[i]
        if first_token >= 0:
            if starts[p] <= first_token <= ends[p] + WINDOW_SLACK_NS:
                phase[k] = "prefill"
        elif i not in first_seen:
            first_seen[i] = k
            phase[k] = "prefill"
    return phase


def _blank(source: str, order: int) -> dict:
    return {
        "order": order,
        "arrival_ns": -1,
        "scheduled_ns": -1,
        "first_token_ns": -1,
        "finish_ns": -1,
        "exact": True,
        "source": source,
    }


def batch_sizes(tree: CallTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lowest rank's step rows, and each one's requests and tokens as the steps state them
    (0 where they do not)."""
    steps = tree.steps
    rows = np.flatnonzero(steps.rank == steps.rank.min())
    requests = np.maximum(steps.context_requests[rows], 0) + np.maximum(
        steps.generation_requests[rows], 0
    )
    tokens = np.maximum(steps.context_tokens[rows], 0) + np.maximum(
        steps.generation_tokens[rows], 0
    )
    return rows, requests, tokens


def held_back_requests(tree: CallTree, waiting: dict[int, int]) -> dict[int, int]:
    """Per iteration whose queue is known (`waiting`), the waiting requests the step had room
    for while its tokens stayed under `TOKEN_ROOM` of the run's largest step: what a scheduler
    capped too low leaves waiting, and 0 where nothing waited or the step ran full. Empty where
    the steps do not state their batch, since room is then unknown, not none."""
    steps = tree.steps
    if not waiting or not len(steps):
        return {}
    rows, requests, tokens = batch_sizes(tree)
    most_requests, most_tokens = requests.max(), tokens.max()
    if most_requests <= 0 or most_tokens <= 0:
        return {}
    out = {}
    for k, iteration in enumerate(steps.index[rows].tolist()):
        if iteration not in waiting:
            continue
        room = max(int(most_requests - requests[k]), 0)
        roomy = tokens[k] < TOKEN_ROOM * most_tokens
        out[int(iteration)] = min(waiting[iteration], room) if roomy else 0
    return out
