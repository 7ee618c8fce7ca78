"""Step records → the model's `Batch`, for a given TPE vocabulary.

A record's candidate paths become TPE tokens (`raw=True`: every node its own token, the "no
TPE" ablation), its log lines hashed template buckets folded into the checkpoint's `log_vocab`,
its request queue one more log position in a template slot of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from teller.rca.dataset.features import token_features
from teller.rca.dataset.records import StepRecord
from teller.rca.inputs import (
    CANDIDATE_KINDS,
    FAULT_NAMES,
    MAX_LOG_LINES,
    PATH_TOKENS,
    ROLE_CONTEXT,
    ROLE_FOCUS,
    Batch,
)
from teller.rca.plans import MECHANISMS
from teller.slices.slice import Slice
from teller.tpe.tokenizer import TPE

#: Localizer candidate kinds the model reads as one of its own: an idle-GPU candidate is host
#: work that delayed the GPU, i.e. compute on the host; a persistent shift is compute that regressed.
_KIND_AS = {"idle": "compute", "shift": "compute", "forward": "compute", "wait": "transfer"}


def train_vocab(records: Sequence[StepRecord], vocab_size: int) -> TPE:
    """A TPE vocabulary learned from the candidate paths of the training records."""
    slices = [path for record in records for path in record.paths]
    # node-weighted pair counts: the shipped checkpoints' vocabularies were learned with them,
    # and their weights expect those tokens
    return TPE.train(slices, vocab_size, weighting="node")


def path_tokens(tpe: TPE, path: Slice, raw: bool) -> list[tuple[int, int, int, int, int]]:
    """(kind id, layer, rank, dur_ns, depth) per token of an ancestor path, root first.

    With `raw`, every node is its own token with its base kind (no merges)."""
    if raw:
        return [
            (
                tpe.kind_id(int(path.layer[i]), path.node_name(i)),
                int(path.layer[i]),
                int(path.rank[i]),
                int(path.dur[i]),
                int(path.depth[i]),
            )
            for i in range(len(path))
        ]
    tokens = tpe.encode(path)
    out = []
    for t in range(len(tokens)):
        first = int(tokens.offsets[t])
        position = int(tokens.position[first])
        out.append(
            (
                int(tokens.kind[t]),
                int(path.layer[position]),
                int(tokens.rank[first]),
                int(tokens.dur_ns[t]),
                int(tokens.depth[t]),
            )
        )
    return out


def encode(
    records: Sequence[StepRecord],
    tpe: TPE,
    raw: bool = False,
    log_vocab: int = 64,
) -> Batch[np.ndarray]:
    """The records as one padded batch, labels included (the explanation head's mechanism on
    anomalous steps, -1 elsewhere); `focus_candidate[b, t]` maps a token to its candidate."""
    batch = Batch.blank(len(records))
    for b, record in enumerate(records):
        batch.step_float[b] = record.step_float
        lines = min(len(record.log_template), MAX_LOG_LINES)
        batch.log_template[b, :lines] = (record.log_template[:lines] - 1) % log_vocab + 1
        batch.log_float[b, :lines] = record.log_float[:lines]
        if record.queue is not None:  # its own template slot, after the hashed buckets
            slot = min(lines, MAX_LOG_LINES - 1)
            batch.log_template[b, slot] = log_vocab + 1
            batch.log_float[b, slot] = record.queue
        t = 0
        for c, (candidate, path) in enumerate(zip(record.candidates, record.paths, strict=True)):
            tokens = path_tokens(tpe, path, raw)[-PATH_TOKENS:]
            for j, (kind, layer, rank, dur_ns, depth) in enumerate(tokens):
                focus = j == len(tokens) - 1
                batch.tok_kind[b, t] = kind
                batch.tok_layer[b, t] = layer
                batch.tok_rank[b, t] = rank
                batch.tok_role[b, t] = ROLE_FOCUS if focus else ROLE_CONTEXT
                token_features(
                    batch.tok_float[b, t], dur_ns, depth, candidate if focus else None, c
                )
                if focus:
                    kind = _KIND_AS.get(candidate.kind, candidate.kind)
                    batch.tok_ckind[b, t] = CANDIDATE_KINDS.index(kind)
                    batch.focus_candidate[b, t] = c
                    if c == record.target:
                        batch.y_ptr[b] = t
                t += 1
        batch.y_step[b] = float(record.anomalous)
        batch.y_fault[b] = FAULT_NAMES.index(record.fault)
        if record.anomalous and record.mechanism is not None:
            batch.y_mechanism[b] = MECHANISMS.index(record.mechanism)
    return batch
