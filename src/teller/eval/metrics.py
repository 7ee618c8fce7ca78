"""The evaluation protocol's metrics (DESIGN.md §5), as plain functions over plain data.

Every method — the localizer, the baselines, the model — is scored by these same functions, so a
difference on the scoreboard is a difference in the method, never in the arithmetic. Definitions:

* Step detection: precision/recall/F1 over step keys (e.g. ``(case_id, step)``); anomalous steps
  are the positives. With no positives and no flags, precision and recall are 1 (nothing to find,
  nothing claimed); otherwise an empty denominator gives 0.
* AC@k: share of cases whose guilty operator is among the top k candidates. Ties are resolved
  pessimistically: a guilty candidate tied in score with others counts at the worst position of
  its tie group, so a method cannot gain by emitting equal scores.
* Avg@k: mean of AC@1..AC@k.
* Joint F1: a hit is a labelled anomalous step that is flagged *and* whose top-1 operator (and, for
  horizontal faults, rank) is right. Precision = hits / flagged steps, recall = hits / anomalous steps.
* False-alarm rate: flagged steps / all steps, over cases with no fault (``none``,
  ``workload_shift``).
* ROUGE-L F: longest common subsequence of lower-cased word tokens (runs of ``[a-z0-9]``, as the
  reference ``rouge-score`` tokenizer splits them), P = LCS / candidate tokens, R = LCS / reference
  tokens, F with β = 1. A side without tokens gives 0 (as ``rouge-score`` does).
* Faithfulness of one explanation: its text names the operator the method picked and the picked
  rank (as ``rank N`` or ``GPU N``), and no other rank. An explanation made of sentence plans
  (`teller.rca.plans`) names other ranks only in the slots that say whose they are (a peer's time
  for the operator, the rank that lost the rest of the excess): its faithfulness is read from
  its parsed slots.
* Well-formed: the text parses under the plan grammar (`teller.rca.plans.parse`).
* Agreement with the heads: the text parses, every fault type it states is the method's, every
  rank slot holds the picked rank and every operator slot the picked operator.
* Excess explained: the share of the step's excess the named evidence accounts for, as the
  explanation's share sentence states it (the mechanism's rise, or the pointed node's share
  plus the share of the operator it says the rest went to), capped at 1; None for an
  explanation without one (a step no slower than its batch, a hang).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass

from teller.faults import FAULT_FREE
from teller.rca.plans import PLANS, Said, operator_text, parse


@dataclass(frozen=True)
class PRF:
    precision: float
    recall: float
    f1: float
    true_positives: int
    flagged: int
    positives: int

    @classmethod
    def from_counts(cls, hits: int, flagged: int, positives: int) -> PRF:
        if flagged == 0 and positives == 0:
            return cls(1.0, 1.0, 1.0, 0, 0, 0)
        precision = hits / flagged if flagged else 0.0
        recall = hits / positives if positives else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return cls(precision, recall, f1, hits, flagged, positives)


def step_prf(anomalous: Iterable[Hashable], flagged: Iterable[Hashable]) -> PRF:
    """Precision/recall/F1 of flagged step keys against the labelled anomalous ones."""
    truth, claimed = set(anomalous), set(flagged)
    return PRF.from_counts(len(truth & claimed), len(claimed), len(truth))


@dataclass(frozen=True)
class Candidate:
    """One ranked suspect: an operator name (and the rank it ran on) with its score."""

    operator: str
    score: float
    rank: int | None = None


def position_of(
    candidates: Sequence[Candidate], operator: str | Collection[str], rank: int | None = None
) -> int | None:
    """1-based pessimistic position of the first candidate matching operator (and rank, if given).

    Candidates are ordered by score, highest first; the position is the last slot of the match's
    tie group. None when no candidate matches. `operator` may be a set of names that are equally
    right (teller/labels.py: `equivalent_operators`).
    """
    names = {operator} if isinstance(operator, str) else set(operator)
    ordered = sorted(candidates, key=lambda c: -c.score)
    for candidate in ordered:
        if candidate.operator in names and (rank is None or candidate.rank == rank):
            ties = sum(1 for c in ordered if c.score == candidate.score)
            first_of_group = next(i for i, c in enumerate(ordered) if c.score == candidate.score)
            return first_of_group + ties
    return None


def accuracy_at_k(
    ranked: Sequence[Sequence[Candidate]],
    guilty: Sequence[str | Collection[str]],
    k: int,
    guilty_ranks: Sequence[int | None] | None = None,
) -> float:
    """AC@k over cases: share whose guilty operator (and rank, if given) sits in the top k."""
    if not ranked:
        return 0.0
    ranks = guilty_ranks if guilty_ranks is not None else [None] * len(ranked)
    hits = 0
    for candidates, operator, rank in zip(ranked, guilty, ranks, strict=True):
        position = position_of(candidates, operator, rank)
        hits += position is not None and position <= k
    return hits / len(ranked)


def average_at_k(
    ranked: Sequence[Sequence[Candidate]], guilty: Sequence[str | Collection[str]], k: int = 5
) -> float:
    """Avg@k = mean of AC@1..AC@k."""
    return sum(accuracy_at_k(ranked, guilty, j) for j in range(1, k + 1)) / k


def rank_accuracy_at_1(
    ranked: Sequence[Sequence[Candidate]], guilty_ranks: Sequence[int | Collection[int]]
) -> float:
    """Share of cases whose top-1 candidate names the guilty rank (ties pessimistic); a case's
    guilty rank may be a set of ranks its trace cannot tell apart (teller/labels.py)."""
    if not ranked:
        return 0.0
    hits = 0
    for candidates, rank in zip(ranked, guilty_ranks, strict=True):
        ordered = sorted(candidates, key=lambda c: -c.score)
        if ordered:
            top = [c for c in ordered if c.score == ordered[0].score]
            right = rank if isinstance(rank, Collection) else (rank,)
            hits += len(top) == 1 and top[0].rank in right
    return hits / len(ranked)


@dataclass(frozen=True)
class StepVerdict:
    """What a method said about one step: flagged or not, and its top-1 suspect."""

    key: Hashable
    flagged: bool
    operator: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class StepTruth:
    key: Hashable
    anomalous: bool
    operator: str | None = None
    rank: int | None = None
    horizontal: bool = False
    #: the rank must be right: a horizontal fault, or one rank's fault with no operator scored
    #: (`teller.labels.rank_scored`); by default, for horizontal faults only
    rank_scored: bool | None = None
    #: ranks as right as `rank`: a fault on a link or node they share (teller/labels.py)
    equivalent_ranks: frozenset[int] = frozenset()
    #: operator names as right as `operator` (teller/labels.py: `equivalent_operators`)
    equivalent_operators: frozenset[str] = frozenset()


def joint_prf(truths: Sequence[StepTruth], verdicts: Sequence[StepVerdict]) -> PRF:
    """Joint F1: flagged and right about the operator, where one is scored, and about the rank
    where it is (horizontal faults; `StepTruth.rank_scored`)."""
    said = {v.key: v for v in verdicts}
    flagged = sum(1 for v in verdicts if v.flagged)
    positives = sum(1 for t in truths if t.anomalous)
    hits = 0
    for truth in truths:
        verdict = said.get(truth.key)
        if not (truth.anomalous and verdict and verdict.flagged):
            continue
        if (
            verdict.operator != truth.operator
            and verdict.operator not in truth.equivalent_operators
        ):
            continue
        right_ranks = {truth.rank} | truth.equivalent_ranks
        must_rank = truth.horizontal if truth.rank_scored is None else truth.rank_scored
        if must_rank and verdict.rank not in right_ranks:
            continue
        hits += 1
    return PRF.from_counts(hits, flagged, positives)


def false_alarm_rate(verdicts: Sequence[StepVerdict]) -> float:
    """Share of steps flagged, over steps of fault-free cases only (pass only those)."""
    return sum(v.flagged for v in verdicts) / len(verdicts) if verdicts else 0.0


def word_tokens(text: str) -> list[str]:
    """Lower-cased runs of letters and digits: ``aten::mm`` is two words, ``rank 1's`` three."""
    return re.findall(r"[a-z0-9]+", text.lower())


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence (dynamic programme, one row kept)."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F-measure (β = 1) of a candidate sentence against the reference sentence."""
    cand, ref = word_tokens(candidate), word_tokens(reference)
    if not cand or not ref:
        return 0.0
    common = lcs_length(cand, ref)
    if common == 0:
        return 0.0
    precision, recall = common / len(cand), common / len(ref)
    return 2 * precision * recall / (precision + recall)


#: How explanations name a rank: "rank 3", "Rank 3's", and "GPU 3" (one GPU per rank).
RANK_MENTION = re.compile(r"\b(?:rank|gpu)\s+(\d+)", re.IGNORECASE)


def names_exactly(text: str, operator: str | None, rank: int | None) -> bool:
    """Whether an explanation names the operator and rank its method picked and no other rank.

    The operator must appear verbatim (when one was picked) and the rank as ``rank N``/``GPU N``
    (when one was picked); any other rank named is unfaithful. Digits inside the operator's own
    name are not read as a rank. A text made of sentence plans is judged on its slots: the
    operator and rank slots hold the pick (and some sentence names it), and other ranks appear
    only in the slots that say whose they are.
    """
    said = parse(text)
    if said is not None:
        return _names_in_slots(said, operator, rank)
    if operator is not None:
        if operator not in text:
            return False
        text = text.replace(operator, " ")
    named = {int(n) for n in RANK_MENTION.findall(text)}
    return named == ({rank} if rank is not None else set())


def _slot_values(said: list[Said], name: str) -> set[str]:
    return {s.slots[name] for s in said if name in s.slots}


def _names_in_slots(said: list[Said], operator: str | None, rank: int | None) -> bool:
    operators, ranks = _slot_values(said, "op"), _slot_values(said, "rank")
    want_op = {operator_text(operator)} if operator is not None else set()
    want_rank = {str(rank)} if rank is not None else set()
    return operators == want_op and ranks == want_rank


@dataclass(frozen=True)
class Agreement:
    """How one explanation's text agrees with the heads that produced it."""

    well_formed: bool
    fault: bool  # every fault type the text states is the method's
    rank: bool  # every rank slot holds the picked rank
    operator: bool  # every operator slot holds the picked operator
    excess_explained: float | None

    @property
    def agrees(self) -> bool:
        return self.well_formed and self.fault and self.rank and self.operator


def agreement(text: str, fault: str | None, operator: str | None, rank: int | None) -> Agreement:
    """Whether `text` parses under the plan grammar and states the heads' fault, rank and
    operator (module docstring)."""
    said = parse(text)
    if said is None:
        return Agreement(False, False, False, False, None)
    stated = {PLANS[s.plan].fault for s in said} - {None}
    head = {fault} if fault is not None and fault not in FAULT_FREE else set()
    ranks, operators = _slot_values(said, "rank"), _slot_values(said, "op")
    return Agreement(
        well_formed=True,
        fault=stated <= head,
        rank=ranks <= ({str(rank)} if rank is not None else set()),
        operator=operators <= ({operator_text(operator)} if operator is not None else set()),
        excess_explained=_excess_explained(said),
    )


def _share_value(text: str) -> float:
    if text == "all":
        return 1.0
    if text == "under 1%":
        return 0.005
    return float(text.rstrip("%")) / 100


def _excess_explained(said: list[Said]) -> float | None:
    shares = [s for s in said if s.plan.startswith("share.")]
    if not shares:
        return None
    share = shares[0]
    if "share" not in share.slots:  # the evidence exceeds the step's excess: all of it
        named = _duration_ns(share.slots["named"])
        return min(named / max(_duration_ns(share.slots["excess"]), 1.0), 1.0)
    total = _share_value(share.slots["share"])
    if share.plan in _ADDS_THE_REST:  # else the rest's operator is where the rise went
        rise = _duration_ns(share.slots["other_observed"]) - _duration_ns(
            share.slots["other_normal"]
        )
        total += max(rise, 0.0) / max(_duration_ns(share.slots["excess"]), 1.0)
    return min(total, 1.0)


_UNIT_NS = {"ns": 1.0, "µs": 1e3, "ms": 1e6, "s": 1e9}


def _duration_ns(text: str) -> float:
    """A duration as the plans print it ("20.9 ms") in ns."""
    value, unit = text.split(" ")
    return float(value) * _UNIT_NS[unit]


#: Share plans whose other operator explains excess beyond the pointed node's.
_ADDS_THE_REST = frozenset({"share.rest_operator"})
