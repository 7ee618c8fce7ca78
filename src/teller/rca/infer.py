"""Load a trained root-cause model and diagnose a tree's steps: which are anomalous, the guilty
operator and rank the pointer picks among the localizer's candidates, the fault type, and the
explanation head's scores over the mechanisms (`teller.rca.plans.MECHANISMS`).

The words are not written here: the verdict (`teller.rca.diagnose`) composes each finding's
explanation from sentence plans (`teller.rca.explain`) after its rules (one incident per cause,
the host counters' fault type), so there is one explanation of a step, the one a user reads.

`RootCauseMethod` (`teller.eval.model_method`) wraps the model in the scoreboard's estimator
shape (`fit`, `score`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from teller.errors import TraceError
from teller.faults import FAULT_FREE
from teller.ingest.files import guard_reader
from teller.localize import OperatorCandidate
from teller.rca.dataset import StepRecord, encode
from teller.rca.host import HELD_SHARE
from teller.rca.inputs import CANDIDATE_KINDS, FAULT_NAMES, STEP, Batch
from teller.rca.model import ModelConfig, RootCauseModel
from teller.rca.plans import MECHANISMS
from teller.rca.train import FORMAT
from teller.tpe.tokenizer import TPE

DEFAULT_MODEL = Path(__file__).parent / "default_model" / "model"


#: Step output above which a step is reported as anomalous, where the checkpoint holds no
#: calibrated one. Training weighs anomalous steps up by `pos_weight` (w), which multiplies the
#: learned odds by w: an even chance is w / (1 + w).
def threshold(config: ModelConfig) -> float:
    return config.pos_weight / (1.0 + config.pos_weight)


#: A step at least `UNMISSABLE_RATIO` times what its batch predicts, at a robust z of at least
#: `UNMISSABLE_Z` among the run's steps, is flagged whatever the step head says (`unmissable`).
UNMISSABLE_RATIO = 3.0
UNMISSABLE_Z = 4.0


def _slower_than(records: Sequence[StepRecord], ratio: float) -> np.ndarray:
    """Per record, whether the step took at least `ratio` times what its batch predicts."""
    return np.array([0 < ratio * r.expected_ns <= r.dur_ns for r in records], dtype=bool)


def unmissable(records: Sequence[StepRecord]) -> np.ndarray:
    """The steps no reading of the trace can call normal: those that took three times what their
    batch predicts and stand out among the run's steps (the localizer's measurement, not a
    learned one). Why: the step head is a learned score, and on a run unlike its training ones
    it can leave such a step under its threshold while the verdict's own step table shows it
    taking five times its expected time; flagged, the step still gets the model's pick, fault
    type and explanation. src/teller/rca/default_model/README.md has the figures with and
    without it."""
    z = np.array([r.step_float[STEP["z"]] * 10.0 for r in records])
    return _slower_than(records, UNMISSABLE_RATIO) & (z >= UNMISSABLE_Z)


#: A step at least `HELD_SLOWER` times what its batch predicts, on which the host counters show a
#: rank held off a CPU (a quota's throttling, a stop) for `HELD_SHARE` of its time beyond that
#: rank's usual (`teller.rca.host`), is flagged whatever the step head says (`held_off_cpu`).
#: 1.2: above where a healthy step sits (its median is 1.07-1.11x on the lab's recordings, since
#: a step's prediction is fitted to the run's fast steps), chosen on the development cases of
#: evalsets/lab-dev-quota-v1.json, whose unlabelled steps never have a rank held off that long
#: (docs/scoreboard.md).
HELD_SLOWER = 1.2
#: The fault type settles the pointer (`pointer_kinds`) only where the flagged steps give it at
#: least this probability on average: more likely than not.
TYPE_SETTLES_POINTER = 0.5
#: Steps the members read at once. A run's forward pass in chunks keeps its activations to a
#: chunk's (all 1,600 steps of 8 x 800 at once took the analysis to its peak); a step's outputs
#: do not depend on which other steps share its chunk.
FORWARD_CHUNK_STEPS = 256


def held_off_cpu(records: Sequence[StepRecord], held_share: dict[int, float]) -> np.ndarray:
    """The steps whose slowness has a measured cause the step head cannot read: the host
    counters `teller collect` sampled (`teller.rca.host.held_off_share`) show a rank held off a
    CPU it could use for a tenth of the step or more, and the step took longer than a healthy
    step does against what its batch predicts (`HELD_SLOWER`). Why: the head reads the trace and
    the logs, not the counters, and on the lab's CPU quota it leaves under its threshold steps
    that ran a fifth longer than predicted or more while the counters show the quota
    throttling the rank through them. Neither reading runs in a healthy step
    (`scripts/floor_report.py` on the lab cases: src/teller/rca/default_model/README.md)."""
    held = np.array([held_share.get(r.iteration, 0.0) >= HELD_SHARE for r in records], dtype=bool)
    return held & _slower_than(records, HELD_SLOWER)


#: The fault type a logged preemption names: the KV cache was too small for the load.
PREEMPTION_FAULT = "kv_pressure"


def logged_preemption(records: Sequence[StepRecord]) -> np.ndarray:
    """The steps in which the engine's logs say it preempted a request (`StepRecord.preempted`):
    its KV cache was full, so a running request lost its blocks and will run its prefill
    again. Why a floor: that costs the preempted request its latency, not the step its time
    (the step that evicts runs a smaller batch), so the step head, which reads step times
    first, leaves such steps under its threshold: on sim-eval-v7's KV-pressure cases it found
    37% of them while 45 of their 46 had a preemption line aligned. The step takes that
    type (`PREEMPTION_FAULT`) whatever the head or the run's other flagged steps say: a
    preemption beside a slow link is a second incident, not the link's."""
    return np.array([(r.preempted or 0) > 0 for r in records], dtype=bool)


#: A KV cache at least this full, as the engine's line in the step states it, may have run out
#: of blocks there; below it the running batch had room for its next tokens.
KV_FULL = 0.8


def cache_refutes(records: Sequence[StepRecord]) -> np.ndarray:
    """Per record, whether a log line aligned to the step states a KV cache fill under
    `KV_FULL` (`StepRecord.kv_cache_fill`; unknown counts as not shown). Why a rule: an engine
    preempts only when its cache has no free block, and a capped scheduler leaves requests
    waiting just as a full cache does, so the type head can call one the other; the fill the
    engine printed in that step tells them apart. On sim-eval-v7 the KV-pressure cases' labelled
    steps state 86-100% and a capped scheduler's 35-42%, which the head typed kv_pressure in
    eval7-041 (docs/scoreboard.md)."""
    return np.array(
        [r.kv_cache_fill is not None and r.kv_cache_fill < KV_FULL for r in records], dtype=bool
    )


#: The fault type whose steps must show it in the request queue (`queue_refutes`).
QUEUED_FAULT = "scheduler_misconfig"


def held_back_with_room(records: Sequence[StepRecord]) -> np.ndarray:
    """The steps that left waiting requests they had room for (`StepRecord.held_back`) while
    their own engine line states a KV cache under `KV_FULL`: a scheduler capped below what the
    engine and its cache could run, which is the fault itself (`QUEUED_FAULT`). Why a floor: a
    capped scheduler makes steps smaller, not slower, so the step head can leave them under
    its threshold (sim-eval-v7's eval7-009 and eval7-057, 14 labelled steps, none found); a
    full cache holds requests back too, hence the fill. Over the 48 lab cases of lab-val-v1,
    lab-eval-v1 and lab-shapes-v1 every step that held a request back was inside a capped
    scheduler's labels (491 of its 497 labelled steps did), and on sim-eval-v7 all 40 of its
    labelled steps did, the other 92 that did stating a cache 93.5-100% full
    (docs/scoreboard.md)."""
    held = np.array([(r.held_back or 0) > 0 for r in records], dtype=bool)
    return held & cache_refutes(records)


def queue_refutes(records: Sequence[StepRecord]) -> np.ndarray:
    """Per record, whether the run's request records show the step left no waiting request it
    had room for (`StepRecord.held_back` is 0; unknown counts as not shown). A scheduler
    capped too low is that and nothing else: its cause is requests held back while batches
    ran below what the engine ran, so a step typed `QUEUED_FAULT` that held none back has
    no cause left. Why a rule: the step head reads the queue among much else, and on fault-free
    lab runs it flags steps a tenth to a third above their expected time with that type, while
    every step it flags of the lab's misconfigured schedulers held requests back
    (docs/scoreboard.md)."""
    return np.array([r.held_back == 0 for r in records], dtype=bool)


#: The least weight a flagged step has in the pooled fault type.
MIN_POOL_WEIGHT = 1e-6


def _fault_types(
    fault_logp: np.ndarray,
    probability: np.ndarray,
    rows: np.ndarray,
    pool: bool,
    exclude: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per step, its fault type and that type's probability: the step's own most likely type,
    or with `pool`, for the `rows`, the one type they favour together (log-probabilities
    summed, each weighted by its step probability). `exclude` is a type ruled out."""
    own = fault_logp.copy()
    if exclude is not None:
        own[:, exclude] = -np.inf
    faults = own.argmax(-1)
    type_probability = np.exp(fault_logp[np.arange(len(faults)), faults])
    if pool and rows.any():
        # a floor's step counts even where the head gives it next to nothing
        weights = np.maximum(probability[rows, None], MIN_POOL_WEIGHT)
        pooled = (weights * fault_logp[rows]).sum(axis=0)
        if exclude is not None:
            pooled[exclude] = -np.inf
        faults[rows] = int(pooled.argmax())
        held = np.exp(fault_logp[rows, faults[rows]])
        type_probability[rows] = float(np.average(held, weights=weights[:, 0]))
    return faults, type_probability


def _rule_out(
    fault_logp: np.ndarray,
    probability: np.ndarray,
    faults: np.ndarray,
    type_probability: np.ndarray,
    pool: bool,
    rows: np.ndarray,
    exclude: int,
) -> None:
    """In place: the `rows` take their most likely type other than `exclude`, pooled as
    `_fault_types` pools them, and that type's probability."""
    if rows.any():
        kept, kept_probability = _fault_types(fault_logp, probability, rows, pool, exclude)
        faults[rows], type_probability[rows] = kept[rows], kept_probability[rows]


def step_threshold(meta: dict, config: ModelConfig) -> float:
    """The checkpoint's step threshold: the one `teller calibrate` chose on cases the model never
    trained on (config.json's `calibration.step_threshold`), else the even-chance rule above.
    Why calibrate: an ensemble's averaged, class-weighted output is not a probability, so the
    even-chance rule can sit far from the cut that trades missed steps against false alarms best
    (default_model/README.md has the figures of the shipped one)."""
    calibration = meta.get("calibration")
    if calibration is None:
        return threshold(config)
    chosen = calibration.get("step_threshold") if isinstance(calibration, dict) else None
    if isinstance(chosen, bool) or not isinstance(chosen, (int, float)) or not 0 < chosen < 1:
        raise ValueError(f"calibration.step_threshold must be a number in (0, 1): {chosen!r}")
    return float(chosen)


@dataclass(frozen=True)
class ModelOutputs:
    """The members' outputs for a run's steps before any threshold decides which are flagged:
    the encoded inputs, and their averaged step probability, pointer distribution and
    fault-type log-probabilities.

    The members' own outputs are not kept: their tokens' hidden states, held for every step of
    a long run, would be most of what the model adds to the analysis's peak, and the
    explanation head reads them for the flagged steps only (`LoadedModel._mechanisms`)."""

    arrays: Batch[np.ndarray]
    probability: np.ndarray
    pointer: np.ndarray
    fault_logp: np.ndarray


@dataclass
class NodeFacts:
    """The pointed node's own facts, for a caller reading the diagnoses without a verdict."""

    operator: str
    rank: int
    observed_ns: int
    normal_ns: int
    log_line: str | None = None


@dataclass
class StepDiagnosis:
    iteration: int
    probability: float
    anomalous: bool
    dur_ns: int
    expected_ns: int
    fault: str
    facts: NodeFacts | None
    candidates: list[tuple[OperatorCandidate, float]] = field(default_factory=list)
    #: the explanation head's score per `teller.rca.plans.MECHANISMS` (None: the fault's default)
    mechanism_scores: list[float] | None = None


@dataclass
class LoadedModel:
    """A checkpoint ready to diagnose. An ensemble's members (`teller train --members K`) vote:
    their step probabilities, pointer distributions, fault-type and mechanism probabilities are
    averaged, each member reading the node they agree on."""

    model: RootCauseModel  # the first member: its configuration is the checkpoint's
    tpe: TPE
    raw_nodes: bool
    path: Path
    members: list[RootCauseModel] = field(default_factory=list)  # all of them, `model` first
    #: fault type → candidate kinds its guilty node may have (`teller.rca.train.pointer_kinds`)
    pointer_kinds: dict[str, list[str]] = field(default_factory=dict)
    #: step output from which a step is flagged (`step_threshold`); None: the even-chance rule
    threshold: float | None = None

    def __post_init__(self) -> None:
        if not self.members:
            self.members = [self.model]
        if self.threshold is None:
            self.threshold = threshold(self.model.config)

    @classmethod
    def load(cls, path: str | Path | None = None) -> LoadedModel:
        """Weights from safetensors, configuration and vocabulary from JSON (never a pickle).

        Any malformed checkpoint (a config of the wrong shape, a corrupt safetensors header) is a
        TraceError naming the directory, like any other bad input."""
        path = Path(path) if path is not None else DEFAULT_MODEL
        with guard_reader(path, "a teller model directory (config.json, model.safetensors)"):
            try:
                return cls._load(path)
            except SafetensorError as error:
                raise TraceError(path / "model.safetensors", f"unusable weights: {error}") from None

    @classmethod
    def _load(cls, path: Path) -> LoadedModel:
        try:
            meta = json.loads((path / "config.json").read_text())
        except FileNotFoundError:
            raise TraceError(path, "not a model directory (no config.json)") from None
        except json.JSONDecodeError as error:
            raise TraceError(path / "config.json", f"not valid JSON ({error.msg})") from None
        if (
            meta.get("format") != FORMAT
            or tuple(meta.get("fault_names", ())) != FAULT_NAMES
            or tuple(meta.get("mechanisms", ())) != MECHANISMS
        ):
            raise TraceError(path / "config.json", f"not a {FORMAT} model for this teller")
        count = meta.get("members", 1)
        if not isinstance(count, int) or count < 1:
            raise TraceError(path / "config.json", f"members must be a positive integer: {count!r}")
        try:
            weights = load_file(path / "model.safetensors")
            members = []
            for k in range(count):
                prefix = f"member{k}." if count > 1 else ""
                own = {n[len(prefix) :]: v for n, v in weights.items() if n.startswith(prefix)}
                member = RootCauseModel(ModelConfig(**meta["model"]))
                member.load_state_dict(own)
                members.append(member.eval())
            if sum(len(m.state_dict()) for m in members) != len(weights):
                raise RuntimeError(f"tensors for more than the {count} member(s) config.json names")
        except (OSError, RuntimeError) as error:
            raise TraceError(path / "model.safetensors", f"unusable weights: {error}") from None
        tpe = TPE.load(path / "tpe.json")
        kinds = meta.get("pointer_kinds", {})
        if not isinstance(kinds, dict) or any(
            f not in FAULT_NAMES or not set(v) <= set(CANDIDATE_KINDS) for f, v in kinds.items()
        ):
            raise TraceError(path / "config.json", f"pointer_kinds is not fault → kinds: {kinds!r}")
        try:
            chosen = step_threshold(meta, members[0].config)
        except ValueError as error:
            raise TraceError(path / "config.json", str(error)) from None
        return cls(members[0], tpe, bool(meta["raw_nodes"]), path, members, kinds, chosen)

    def diagnose_records(
        self,
        records: Sequence[StepRecord],
        pool_faults: bool = True,
        threshold: float | None = None,
        outputs: ModelOutputs | None = None,
        held_share: dict[int, float] | None = None,
    ) -> list[StepDiagnosis]:
        """One diagnosis per record (the steps of one run); a step is flagged from `threshold`
        (default: the checkpoint's), or by the floors under it (`unmissable`, and
        `held_off_cpu` where `held_share` holds the run's host counters). `outputs`:
        `forward(records)` where the caller has it (a calibration tries many thresholds on one
        forward pass).

        With `pool_faults`, every flagged step of the run gets the one fault type that the flagged
        steps' explanation outputs favour together (log-probabilities summed, each weighted by
        its step probability). Why: a run's slow window has one cause far more often than several,
        and the cause shows unevenly step by step (a co-tenant's erratic kernels look like a power
        cap on the steps where they happen to be steady); one step's evidence is then outvoted by
        the rest. Operators and ranks stay per step. Where its type is a capped scheduler and the
        queue shows nothing held back (`queue_refutes`), a step the head alone flags is let go,
        and one a floor flags takes the most likely other type: the floor says the step is slow,
        the queue says a cap was not why. Likewise a step typed KV pressure whose engine line
        states a cache with room (`cache_refutes`) takes the most likely other type."""
        if not records:
            return []
        if outputs is None:
            outputs = self.forward(records)
        arrays = outputs.arrays
        probability, pointer, fault_logp = outputs.probability, outputs.pointer, outputs.fault_logp
        preempting = logged_preemption(records)
        capped = held_back_with_room(records) & ~preempting
        named = preempting | capped  # floors that name their type
        floored = unmissable(records) | named
        if held_share:
            floored |= held_off_cpu(records, held_share)
        flagged = floored | (probability >= (self.threshold if threshold is None else threshold))
        # a floor that names its type keeps its steps out of the pool: they neither join nor sway it
        faults, type_probability = _fault_types(
            fault_logp, probability, flagged & ~named, pool_faults
        )
        kv, queued = FAULT_NAMES.index(PREEMPTION_FAULT), FAULT_NAMES.index(QUEUED_FAULT)
        faults[preempting], faults[capped] = kv, queued
        type_probability[named] = 1.0  # the engine's own log, not the head's reading
        # the cache had room: the step keeps its flag, not that type
        roomy = flagged & ~preempting & (faults == kv) & cache_refutes(records)
        types = (fault_logp, probability, faults, type_probability, pool_faults)
        _rule_out(*types, roomy, kv)
        refuted = queue_refutes(records)
        flagged &= floored | ~((faults == queued) & refuted)
        # a floor keeps the step; the queue rules out its type, not the step
        _rule_out(*types, flagged & refuted & (faults == queued), queued)
        settled = flagged & (type_probability >= TYPE_SETTLES_POINTER)
        if settled.any() and self.pointer_kinds:
            pointer = self._given_fault(pointer, arrays, faults, settled)
        mechanisms = np.zeros((len(records), len(MECHANISMS)))
        if flagged.any():  # the explanation head reads the pick and fault type settled above
            rows = np.flatnonzero(flagged)
            mechanisms[rows] = self._mechanisms(
                arrays, rows, pointer[rows].argmax(-1), faults[rows]
            )
        out = []
        for b, record in enumerate(records):
            focus = arrays.focus_candidate[b]
            ranked = sorted(
                ((int(focus[t]), float(pointer[b, t])) for t in np.flatnonzero(focus >= 0)),
                key=lambda pair: -pair[1],
            )
            candidates = [(record.candidates[c], p) for c, p in ranked]
            facts = None
            if candidates:
                top = candidates[0][0]
                facts = NodeFacts(
                    top.operator,
                    top.rank,
                    top.observed_ns,
                    top.normal_ns,
                    record.log_lines[0] if record.log_lines else None,
                )
            fault = FAULT_NAMES[int(faults[b])]
            out.append(
                StepDiagnosis(
                    iteration=record.iteration,
                    probability=float(probability[b]),
                    anomalous=bool(flagged[b]),
                    dur_ns=record.dur_ns,
                    expected_ns=record.expected_ns,
                    fault=fault,
                    facts=facts,
                    candidates=candidates,
                    mechanism_scores=mechanisms[b].tolist() if flagged[b] else None,
                )
            )
        return out

    def forward(self, records: Sequence[StepRecord]) -> ModelOutputs:
        """The members' forward pass over a run's step records, before any threshold, a chunk
        of `FORWARD_CHUNK_STEPS` steps at a time."""
        arrays = encode(
            records, self.tpe, raw=self.raw_nodes, log_vocab=self.model.config.log_vocab
        ).inputs()
        chunks = [
            self._forward_rows(arrays.rows(slice(start, start + FORWARD_CHUNK_STEPS)))
            for start in range(0, max(len(arrays), 1), FORWARD_CHUNK_STEPS)
        ]
        return ModelOutputs(
            arrays,
            np.concatenate([chunk.probability for chunk in chunks]),
            np.concatenate([chunk.pointer for chunk in chunks]),
            np.concatenate([chunk.fault_logp for chunk in chunks]),
        )

    def _mechanisms(
        self, arrays: Batch[np.ndarray], rows: np.ndarray, pointed: np.ndarray, faults: np.ndarray
    ) -> np.ndarray:
        """The members' mean mechanism probabilities for the steps at `rows`, each member
        reading the `pointed` token under the fault type `faults` gives. The tokens' hidden
        states (what `forward` does not keep) are read again a chunk at a time and dropped with
        their chunk."""
        out = []
        with torch.no_grad():
            for start in range(0, len(rows), FORWARD_CHUNK_STEPS):
                part = slice(start, start + FORWARD_CHUNK_STEPS)
                batch = arrays.rows(rows[part]).map(torch.from_numpy)
                chosen, fault_of = [], torch.from_numpy(faults[part])
                for member in self.members:
                    o = member(batch)[0]
                    read = member.read_pointed(o, torch.from_numpy(pointed[part]))["chosen"]
                    logits = member.mechanism_logits(o["summary"], read, fault_of)
                    chosen.append(torch.softmax(logits, dim=-1))
                out.append(torch.stack(chosen).mean(0).numpy())
        return np.concatenate(out)

    def _forward_rows(self, arrays: Batch[np.ndarray]) -> ModelOutputs:
        """The members' forward pass over some steps' encoded inputs."""
        batch = arrays.map(torch.from_numpy)
        with torch.no_grad():
            each = [member(batch)[0] for member in self.members]
            probability = torch.stack([torch.sigmoid(o["step_logit"]) for o in each]).mean(0)
            pointer = torch.stack([torch.softmax(o["pointer"], dim=-1) for o in each]).mean(0)
            if len(each) > 1:  # the fault head reads the node the members chose
                pointed = pointer.argmax(-1)
                for member, o in zip(self.members, each, strict=True):
                    o.update(member.read_pointed(o, pointed))
            fault_logp = []
            for o in each:
                for name in FAULT_FREE:
                    o["fault_logits"][:, FAULT_NAMES.index(name)] = -torch.inf
                fault_logp.append(torch.log_softmax(o["fault_logits"], dim=-1))
            # the log of the members' mean probability
            fault_logp = torch.logsumexp(torch.stack(fault_logp), 0) - np.log(len(each))
        return ModelOutputs(arrays, probability.numpy(), pointer.numpy(), fault_logp.numpy())

    def _given_fault(
        self,
        pointer: np.ndarray,
        arrays: Batch[np.ndarray],
        faults: np.ndarray,
        flagged: np.ndarray,
    ) -> np.ndarray:
        """The flagged steps' pointer distributions given their fault type: candidates of a kind
        the type's guilty node never had in training get no weight, the rest are renormalised.
        A step with no candidate of an allowed kind keeps its distribution as it was.

        Only a fault type the steps give more likely than not (`TYPE_SETTLES_POINTER`) is
        applied: a fault unlike any in training gets a diffuse type, and the nearest type's
        kinds would veto what the pointer read. A checkpoint trained without stragglers
        (`teller train --held-out straggler`) typed them kv_pressure or host_cpu_contention at
        0.07-0.27 a step and, held to compute candidates, named the model's forward instead of
        the late all-reduce: operator AC@1 0.375 on the ten straggler cases of the board, 0.875
        with this rule (docs/scoreboard.md)."""
        pointer = pointer.copy()
        for b in np.flatnonzero(flagged).tolist():
            kinds = self.pointer_kinds.get(FAULT_NAMES[int(faults[b])])
            if not kinds:
                continue
            allowed = (arrays.focus_candidate[b] >= 0) & np.isin(
                arrays.tok_ckind[b], [CANDIDATE_KINDS.index(k) for k in kinds]
            )
            weight = float(pointer[b, allowed].sum())
            if weight > 0:
                pointer[b] = np.where(allowed, pointer[b], 0.0) / weight
        return pointer


def variant_dir(name: str) -> Path:
    """A shipped model variant (`model`, `no-logs`, `no-numeric`, `raw-nodes`)."""
    return DEFAULT_MODEL.parent / name
