"""How well a vocabulary compresses one trace: reduction per slice and the merges that pay most.

`teller tpe stats` prints this; a merge's worth on a trace is the nodes it saves there (each use of
a token of n nodes saves n - 1 tokens), shown as the small subtree the token stands for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from teller.errors import TraceError
from teller.ingest.schema import LAYERS
from teller.tpe.corpus import find_runs, run_slices
from teller.tpe.tokenizer import TPE, Tokens


@dataclass
class SliceReduction:
    label: str  # "rank 0 step 3" or "root 12"
    nodes: int
    tokens: int

    @property
    def reduction(self) -> float:
        return 1.0 - self.tokens / self.nodes if self.nodes else 0.0


@dataclass
class TokenUse:
    token: int
    uses: int
    nodes_saved: int


@dataclass
class TraceStats:
    """Per-slice reduction of one trace under one vocabulary, and its most useful tokens."""

    path: str
    slices: list[SliceReduction]
    top_tokens: list[TokenUse]
    residual_bytes: int
    unknown_nodes: int  # nodes whose kind the vocabulary does not know (<unk-…>)

    @property
    def nodes(self) -> int:
        return sum(s.nodes for s in self.slices)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.slices)

    def reductions(self) -> np.ndarray:
        return np.asarray([s.reduction for s in self.slices])


def trace_stats(path: str | Path, tpe: TPE, top: int = 10) -> TraceStats:
    """Encode every slice of the run at `path` (a trace file or a case directory)."""
    runs = find_runs([path])
    if len(runs) != 1:
        raise TraceError(path, f"holds {len(runs)} runs; name one case directory or trace file")
    slices = run_slices(runs[0])
    if not slices:
        raise TraceError(path, "the trace holds no call-chain nodes")
    rows: list[SliceReduction] = []
    uses: dict[int, int] = {}
    residual = 0
    unknown = 0
    for number, piece in enumerate(slices):
        tokens = tpe.encode(piece)
        rows.append(SliceReduction(_label(piece, number), len(piece), len(tokens)))
        for token, count in zip(*np.unique(tokens.kind, return_counts=True), strict=True):
            uses[int(token)] = uses.get(int(token), 0) + int(count)
        residual += tokens.residual_bytes()
        unknown += _unknown_nodes(tpe, tokens)
    ranked = sorted(
        (TokenUse(t, n, n * (tpe.pattern_length(t) - 1)) for t, n in uses.items()),
        key=lambda u: (-u.nodes_saved, u.token),
    )
    return TraceStats(
        str(path), rows, [u for u in ranked if u.nodes_saved][:top], residual, unknown
    )


def _label(piece, number: int) -> str:
    if piece.kind == "step" and len(piece):
        return f"rank {int(piece.rank[0])} step {piece.steps[0]}"
    return f"root {number}"


def _unknown_nodes(tpe: TPE, tokens: Tokens) -> int:
    count = 0
    for token in np.unique(tokens.kind).tolist():
        kinds = tpe.pattern(token)[0]
        per_use = sum(1 for k in kinds if k < len(LAYERS))
        if per_use:
            count += per_use * int(np.count_nonzero(tokens.kind == token))
    return count


def render_pattern(tpe: TPE, token: int, max_nodes: int = 12) -> str:
    """The subtree a token stands for, indented, one node per line (launch edges marked ⇒)."""
    kinds, parents, edges = tpe.pattern(token)
    depth = [0] * len(kinds)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            depth[i] = depth[p] + 1
            children.setdefault(p, []).append(i)
    order: list[int] = []
    stack = [i for i in reversed(range(len(kinds))) if parents[i] < 0]  # one or more roots
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children.get(node, [])))
    lines = []
    for node in order[:max_nodes]:
        arrow = "⇒ " if edges[node] == 2 else ""
        lines.append("  " * depth[node] + arrow + _short(tpe.token_name(kinds[node])))
    if len(order) > max_nodes:
        lines.append(f"… {len(order) - max_nodes} more nodes")
    return "\n".join(lines)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_stats(stats: TraceStats, tpe: TPE, max_rows: int = 20) -> str:
    """Text report: per-slice reduction (first rows), summary, then the top tokens as subtrees."""
    reductions = stats.reductions()
    lines = [
        f"{stats.path}: {len(stats.slices)} slices, {stats.nodes:,} nodes → {stats.tokens:,} tokens "
        f"(vocabulary {tpe.vocab_size:,})",
        f"R = 1 - tokens/nodes per slice: mean {reductions.mean():.1%}, "
        f"median {np.median(reductions):.1%}, min {reductions.min():.1%}, max {reductions.max():.1%}",
        f"residuals kept for exact decoding: {stats.residual_bytes / max(stats.nodes, 1):.1f} "
        f"bytes/node; nodes of unknown kind: {stats.unknown_nodes:,}",
        "",
        f"{'slice':<22} {'nodes':>9} {'tokens':>8} {'R':>7}",
    ]
    for row in stats.slices[:max_rows]:
        lines.append(f"{row.label:<22} {row.nodes:>9,} {row.tokens:>8,} {row.reduction:>7.1%}")
    if len(stats.slices) > max_rows:
        lines.append(f"… {len(stats.slices) - max_rows} more slices")
    lines.append("")
    lines.append("most useful merges on this trace (nodes saved):")
    for use in stats.top_tokens:
        lines.append(
            f"- {tpe.token_name(use.token)}: {use.uses:,} uses × "
            f"{tpe.pattern_length(use.token)} nodes, saves {use.nodes_saved:,}"
        )
        lines.extend("    " + line for line in render_pattern(tpe, use.token).splitlines())
    return "\n".join(lines)
