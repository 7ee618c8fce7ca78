"""TPE: Trace Pair Encoding, BPE for call-chain slices (DESIGN.md §1, the `tpe` stage)."""

from teller.tpe.normalize import normalize
from teller.tpe.tokenizer import TPE, Merge, Tokens

__all__ = ["TPE", "Merge", "Tokens", "normalize"]
