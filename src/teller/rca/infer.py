"""Load a trained root-cause model and diagnose a tree: steps, guilty operator and rank, words.

The explanation is grounded by construction: the decoder writes plain words and slots only
(`teller.rca.words`), and the slots are filled from the facts of the node the pointer picked
(`NodeFacts`: operator, rank, observed and normal time). No other operator or rank reaches the
text, so it cannot name one the pointer did not pick; a sentence that names no operator gets the
evidence clause naming the pointed node, and a step without a candidate node gets `NO_NODE`.

`RootCauseMethod` wraps the model in the scoreboard's estimator shape (`fit`, `score`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from teller.callchain.facts import RunFacts
from teller.callchain.render import format_ns
from teller.callchain.tree import CallTree
from teller.errors import TraceError
from teller.faults import FAULT_FREE
from teller.ingest.files import guard_reader
from teller.layout import CaseDir
from teller.localize import OperatorCandidate
from teller.rca.dataset import StepRecord, case_alignment, case_records, encode
from teller.rca.inputs import CANDIDATE_KINDS, FAULT_NAMES, Batch
from teller.rca.model import ModelConfig, RootCauseModel
from teller.rca.train import FORMAT
from teller.rca.words import (
    BOS,
    EVIDENCE,
    NORMAL,
    OBSERVED,
    OP,
    PAD,
    RANK,
    UNK,
    WordVocab,
    fill,
    pieces,
)
from teller.tpe.tokenizer import TPE

if TYPE_CHECKING:
    from teller.align.align import AlignResult

DEFAULT_MODEL = Path(__file__).parent / "default_model" / "model"


#: Step output above which a step is reported as anomalous. Training weighs anomalous steps up by
#: `pos_weight` (w), which multiplies the learned odds by w: an even chance is w / (1 + w).
def threshold(config: ModelConfig) -> float:
    return config.pos_weight / (1.0 + config.pos_weight)


#: For a flagged step with no candidate node at all: nothing to name.
NO_NODE = "Step {step} is slower than its batch predicts; no single operator stands out."


@dataclass
class NodeFacts:
    """What the explanation may say: the pointed node's facts and nothing else."""

    operator: str
    rank: int
    observed_ns: int
    normal_ns: int
    log_line: str | None = None


def explain(words: WordVocab, ids: Sequence[int], facts: NodeFacts | None, step: int) -> str:
    """The decoder's words with their slots filled from the pointed node's facts; a sentence
    that names no operator, or no rank, gets the evidence clause, so the node it rests on (and
    its rank) is always named."""
    if facts is None:
        return NO_NODE.format(step=step)
    said = words.decode(ids)
    # a number after "rank"/"GPU" reads as a rank: only the rank slot may stand there
    said = [
        RANK if i and w in (OBSERVED, NORMAL) and said[i - 1].lower() in ("rank", "gpu") else w
        for i, w in enumerate(said)
    ]
    rank_named = any(
        w == RANK and i and said[i - 1].lower() in ("rank", "gpu") for i, w in enumerate(said)
    )
    if OP not in said or not rank_named:  # both named, always: the evidence clause names them
        said += pieces(EVIDENCE)
    return fill(
        said,
        {
            OP: facts.operator,
            RANK: str(facts.rank),
            OBSERVED: format_ns(facts.observed_ns),
            NORMAL: format_ns(facts.normal_ns),
        },
    )


@dataclass
class StepDiagnosis:
    iteration: int
    probability: float
    anomalous: bool
    dur_ns: int
    expected_ns: int
    fault: str
    facts: NodeFacts | None
    explanation: str
    candidates: list[tuple[OperatorCandidate, float]] = field(default_factory=list)


@dataclass
class LoadedModel:
    """A checkpoint ready to diagnose. An ensemble's members (`teller train --members K`) vote:
    their step probabilities, pointer distributions and fault-type probabilities are averaged,
    and the first member writes the words for the pick they agree on."""

    model: RootCauseModel  # the first member: its configuration and decoder are the checkpoint's
    tpe: TPE
    raw_nodes: bool
    path: Path
    words: WordVocab
    members: list[RootCauseModel] = field(default_factory=list)  # all of them, `model` first
    #: fault type → candidate kinds its guilty node may have (`teller.rca.train.pointer_kinds`)
    pointer_kinds: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.members:
            self.members = [self.model]

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
        if meta.get("format") != FORMAT or tuple(meta.get("fault_names", ())) != FAULT_NAMES:
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
        words = WordVocab.load(path / "words.json")
        kinds = meta.get("pointer_kinds", {})
        if not isinstance(kinds, dict) or any(
            f not in FAULT_NAMES or not set(v) <= set(CANDIDATE_KINDS) for f, v in kinds.items()
        ):
            raise TraceError(path / "config.json", f"pointer_kinds is not fault → kinds: {kinds!r}")
        return cls(members[0], tpe, bool(meta["raw_nodes"]), path, words, members, kinds)

    def diagnose_records(
        self, records: Sequence[StepRecord], pool_faults: bool = True
    ) -> list[StepDiagnosis]:
        """One diagnosis per record (the steps of one run).

        With `pool_faults`, every flagged step of the run gets the one fault type that the flagged
        steps' explanation outputs favour together (log-probabilities summed, each weighted by
        its step probability). Why: a run's slow window has one cause far more often than several,
        and the cause shows unevenly step by step (a co-tenant's erratic kernels look like a power
        cap on the steps where they happen to be steady); one step's evidence is then outvoted by
        the rest. Operators and ranks stay per step."""
        if not records:
            return []
        arrays = encode(
            records, self.tpe, raw=self.raw_nodes, log_vocab=self.model.config.log_vocab
        ).inputs()
        batch = arrays.map(torch.from_numpy)
        with torch.no_grad():
            each = [member(batch)[0] for member in self.members]
            probability = torch.stack([torch.sigmoid(o["step_logit"]) for o in each]).mean(0)
            pointer = torch.stack([torch.softmax(o["pointer"], dim=-1) for o in each]).mean(0)
            if len(each) > 1:  # the fault head and the decoder read the node the members chose
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
        outputs = each[0]
        probability, pointer, fault_logp = probability.numpy(), pointer.numpy(), fault_logp.numpy()
        flagged = probability >= threshold(self.model.config)
        faults = fault_logp.argmax(-1)
        if pool_faults and flagged.any():
            weights = probability[flagged, None]
            faults[flagged] = int((weights * fault_logp[flagged]).sum(axis=0).argmax())
        if flagged.any() and self.pointer_kinds:
            pointer = self._given_fault(pointer, arrays, faults, flagged)
            outputs.update(self.model.read_pointed(outputs, torch.from_numpy(pointer.argmax(-1))))
        sentences = np.zeros((len(records), 1), np.int64)
        if flagged.any():  # the decoder writes for the flagged steps, given their fault type
            rows = torch.from_numpy(np.flatnonzero(flagged))
            condition = self.model.condition_of(
                outputs["summary"][rows], outputs["chosen"][rows], torch.from_numpy(faults)[rows]
            )
            banned = [self.words.index[w] for w in (PAD, BOS, UNK)]
            written = self.model.generate(condition, banned).numpy()
            sentences = np.zeros((len(records), written.shape[1]), np.int64)
            sentences[rows.numpy()] = written
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
                    explanation=explain(self.words, sentences[b], facts, record.iteration),
                    candidates=candidates,
                )
            )
        return out

    def _given_fault(
        self,
        pointer: np.ndarray,
        arrays: Batch[np.ndarray],
        faults: np.ndarray,
        flagged: np.ndarray,
    ) -> np.ndarray:
        """The flagged steps' pointer distributions given their fault type: candidates of a kind
        the type's guilty node never had in training get no weight, the rest are renormalised.
        A step with no candidate of an allowed kind keeps its distribution as it was."""
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

    def diagnose(
        self,
        tree: CallTree,
        alignment: AlignResult | None = None,
        case_id: str = "",
        facts: RunFacts | None = None,
    ) -> list[StepDiagnosis]:
        """Every step of the tree, in step order. `alignment`: the run's logs and spans on its
        steps, as the pipeline aligned them (None: traces alone); `facts`: the tree's, where the
        caller has them."""
        return self.diagnose_records(case_records(tree, case_id, None, alignment, facts))


def variant_dir(name: str) -> Path:
    """A shipped model variant (`model`, `no-logs`, `no-numeric`, `raw-nodes`)."""
    return DEFAULT_MODEL.parent / name


def diagnose_path(
    path: str | Path, log_paths: Sequence[str | Path] = (), model_dir: str | Path | None = None
) -> list[StepDiagnosis]:
    """Diagnose a case directory (traces/, logs/ and otlp/ inside) or a directory of rank trace
    files; `log_paths` stand in for the case's own logs."""
    from teller.callchain.tree import build_tree
    from teller.ingest import find_trace_files, read_run

    path = Path(path)
    if not path.is_dir():
        raise TraceError(path, "not a directory (a case directory or a folder of rank traces)")
    case = CaseDir(path)
    logs = [Path(p) for p in log_paths] or None  # None: the case's own
    files = find_trace_files([case.trace_root()])
    if not files:
        raise TraceError(
            case.trace_root(), "no trace files found (looked for *.json, *.json.gz, *.sqlite)"
        )
    model = LoadedModel.load(model_dir)
    tree = build_tree(read_run(files))
    return model.diagnose(tree, case_alignment(tree, case, logs), case_id=path.name)


def render(diagnoses: list[StepDiagnosis], top: int = 10) -> str:
    """Anomalous steps, most certain first: operator, rank, explanation and the evidence."""
    flagged = sorted((d for d in diagnoses if d.anomalous), key=lambda d: -d.probability)
    if not flagged:
        return f"no anomalous step among {len(diagnoses)}"
    lines = [f"{len(flagged)} anomalous step(s) of {len(diagnoses)}"]
    for d in flagged[:top]:
        where = f"{d.facts.operator} on rank {d.facts.rank}" if d.facts else "no single operator"
        lines.append(
            f"step {d.iteration}  p={d.probability:.2f}  {format_ns(d.dur_ns)} vs "
            f"{format_ns(d.expected_ns)} expected  {d.fault}: {where}"
        )
        lines.append(f"  {d.explanation}")
        if d.facts:
            lines.append(
                f"  evidence: {format_ns(d.facts.observed_ns)} observed vs "
                f"{format_ns(d.facts.normal_ns)} normal"
                + (f"; log: {d.facts.log_line}" if d.facts.log_line else "")
            )
    if len(flagged) > top:
        lines.append(f"… {len(flagged) - top} more")
    return "\n".join(lines)
