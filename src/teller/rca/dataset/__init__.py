"""Cases → the root-cause model's examples: one record per step, then one padded batch.

`records` cuts a case's steps out of the stages already run (tree, facts, alignment), `features`
computes the numbers the model reads, `targets` the training labels, `encoding` the `Batch`.
"""

from teller.rca.dataset.encoding import encode, path_tokens, train_vocab
from teller.rca.dataset.records import (
    StepRecord,
    case_alignment,
    case_records,
    read_case_records,
)

__all__ = [
    "StepRecord",
    "case_alignment",
    "case_records",
    "encode",
    "path_tokens",
    "read_case_records",
    "train_vocab",
]
