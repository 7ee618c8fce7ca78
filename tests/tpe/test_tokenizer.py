"""TPE: lossless round trips (random trees and real traces), unseen kinds, training, persistence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import real_trace
from teller.callchain.tree import EDGE_CALL, EDGE_LAUNCH, build_tree
from teller.errors import TraceError
from teller.ingest import read_trace
from teller.ingest.schema import LAYER_CODE, LAYERS
from teller.slices import root_slices, step_slices
from teller.slices.slice import CommRelations, Slice
from teller.tpe import TPE, kernels
from teller.tpe.tokenizer import SIBLING, UNK_NAMES, _distinct_kinds, _forest, _node_weights

# names that share kinds (template arguments, line numbers, instance ids) and some that do not
NAME_POOL = [
    ("cpu_op", "aten::mm"),
    ("cpu_op", "aten::linear"),
    ("runtime", "cudaLaunchKernel"),
    ("kernel", "void k<1>(int)"),
    ("kernel", "void k<2>(float)"),
    ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"),
    ("python", "model.py(10): forward"),
    ("python", "model.py(12): forward"),
    ("python", "nn.Module: Layer_3"),
    ("engine", "execute_context_1(5)_generation_2(2)"),
    ("memcpy", "Memcpy HtoD (Pinned -> Device)"),
]


@st.composite
def random_slices(draw: st.DrawFn, max_nodes: int = 40) -> Slice:
    """A random forest in slice order (parents first) with random names, edges and times."""
    count = draw(st.integers(0, max_nodes))
    parent = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, count)] if count else []
    picks = [draw(st.integers(0, len(NAME_POOL) - 1)) for _ in range(count)]
    names = sorted({NAME_POOL[p][1] for p in picks})
    edge = [0 if p < 0 else draw(st.sampled_from([EDGE_CALL, EDGE_LAUNCH])) for p in parent]
    depth = [0] * count
    for i, p in enumerate(parent):
        if p >= 0:
            depth[i] = depth[p] + 1
    times = st.integers(-(2**40), 2**62)
    comm_nodes = (
        sorted(draw(st.sets(st.integers(0, max(count - 1, 0)), max_size=3))) if count else []
    )
    comm = CommRelations(
        node=np.asarray(comm_nodes, dtype=np.int64),
        instance=np.arange(len(comm_nodes), dtype=np.int64),
        last_rank=np.ones(len(comm_nodes), dtype=np.int32),
        last_node=np.full(len(comm_nodes), -1, dtype=np.int64),
        last_start_ns=np.arange(len(comm_nodes), dtype=np.int64) * 7,
    )
    return Slice(
        parent=np.asarray(parent, dtype=np.int32),
        edge=np.asarray(edge, dtype=np.int8),
        depth=np.asarray(depth, dtype=np.int32),
        layer=np.asarray([LAYER_CODE[NAME_POOL[p][0]] for p in picks], dtype=np.int8),
        name=np.asarray([names.index(NAME_POOL[p][1]) for p in picks], dtype=np.int32),
        rank=np.asarray([draw(st.integers(0, 3)) for _ in range(count)], dtype=np.int32),
        stream=np.asarray([draw(st.integers(-1, 8)) for _ in range(count)], dtype=np.int32),
        start=np.asarray([draw(times) for _ in range(count)], dtype=np.int64),
        dur=np.asarray([draw(st.integers(0, 2**40)) for _ in range(count)], dtype=np.int64),
        self_ns=np.asarray([draw(st.integers(0, 2**40)) for _ in range(count)], dtype=np.int64),
        tree_node=np.arange(count, dtype=np.int64) * 3,
        names=names,
        comm=comm,
        kind="step",
        steps=(draw(st.integers(0, 5)),),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    corpus=st.lists(random_slices(), min_size=1, max_size=6),
    other=random_slices(),
    vocab=st.integers(len(UNK_NAMES), 64),
)
def test_decode_of_encode_is_the_slice_for_random_trees(
    corpus: list[Slice], other: Slice, vocab: int
) -> None:
    tpe = TPE.train(corpus, vocab, min_count=1)

    assert tpe.vocab_size <= vocab
    for piece in [*corpus, other]:
        piece.validate()
        tokens = tpe.encode(piece)
        assert tpe.decode(tokens) == piece
        assert len(tokens) <= len(piece)
    # every merge learned applies exactly as often on the corpus as training counted
    encoded = sum(len(tpe.encode(p)) for p in corpus)
    assert encoded == sum(len(p) for p in corpus) - sum(tpe.merge_counts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus=st.lists(random_slices(), min_size=1, max_size=5))
def test_incremental_pair_counts_always_equal_a_recount(corpus: list[Slice]) -> None:
    tpe = TPE.train(corpus, 10_000, min_count=1)
    tpe.merges, tpe.merge_counts = [], []  # base alphabet only
    tpe._rebuild_indexes()
    distinct = [_distinct_kinds(piece) for piece in corpus]
    weights = _node_weights(corpus, "slice")
    for merges in range(1, 40):
        forest = _forest(tpe, corpus, distinct)
        learned, pairs = kernels.train_merges(forest, weights, tpe.num_base, merges, 1, -1)
        counts, scores = _recount(forest, weights)
        rows = pairs.data[: pairs.table.used[0]]
        held = np.flatnonzero(rows[:, kernels.P_COUNT] > 0).tolist()
        pair_ids = {tuple(rows[i, : kernels.P_COUNT].tolist()): i for i in held}
        assert {pair: int(rows[i, kernels.P_COUNT]) for pair, i in pair_ids.items()} == counts
        assert all(abs(pairs.score[pair_ids[p]] - s) < 1e-9 for p, s in scores.items())
        if len(learned) < merges:
            break


def _recount(
    forest: kernels.Forest, weights: np.ndarray
) -> tuple[dict[tuple[int, int, int, int], int], dict[tuple[int, int, int, int], float]]:
    """Pair counts and scores from scratch, from the forest's parent and sibling links alone:
    one parent pair per (parent token, slot, edge, child kind), one sibling pair per token with
    a next sibling by the same edge."""
    tok = forest.tok
    kind, parent, slot = tok[:, kernels.KIND].tolist(), tok[:, kernels.PARENT], tok[:, kernels.SLOT]
    edge, after_of = tok[:, kernels.EDGE].tolist(), tok[:, kernels.NEXT]
    owners: set[tuple[int, tuple[int, int, int, int]]] = set()
    for token in np.flatnonzero(tok[:, kernels.ALIVE]).tolist():
        up = int(parent[token])
        if up >= 0:
            owners.add((up, (kind[up], int(slot[token]), edge[token], kind[token])))
        after = int(after_of[token])
        if after >= 0 and edge[after] == edge[token]:
            owners.add((token, (kind[token], SIBLING, edge[token], kind[after])))
    counts: dict[tuple[int, int, int, int], int] = {}
    scores: dict[tuple[int, int, int, int], float] = {}
    for owner, pair in owners:
        counts[pair] = counts.get(pair, 0) + 1
        scores[pair] = scores.get(pair, 0.0) + float(weights[owner])
    return counts, scores


def test_equality_sees_a_changed_time_name_or_parent() -> None:
    piece = _small_slice()
    changed_time = _small_slice()
    changed_time.start[2] += 1
    changed_name = _small_slice()
    changed_name.names[changed_name.name[1]] = "other"
    changed_parent = _small_slice()
    changed_parent.parent[2] = 0

    assert piece == _small_slice()
    assert piece != changed_time
    assert piece != changed_name
    assert piece != changed_parent


def _small_slice() -> Slice:
    return Slice(
        parent=np.asarray([-1, 0, 1], dtype=np.int32),
        edge=np.asarray([0, EDGE_CALL, EDGE_LAUNCH], dtype=np.int8),
        depth=np.asarray([0, 1, 2], dtype=np.int32),
        layer=np.asarray(
            [LAYER_CODE["cpu_op"], LAYER_CODE["runtime"], LAYER_CODE["kernel"]], np.int8
        ),
        name=np.asarray([0, 1, 2], dtype=np.int32),
        rank=np.zeros(3, dtype=np.int32),
        stream=np.asarray([-1, -1, 7], dtype=np.int32),
        start=np.asarray([0, 10, 30], dtype=np.int64),
        dur=np.asarray([100, 20, 50], dtype=np.int64),
        self_ns=np.asarray([80, 20, 50], dtype=np.int64),
        tree_node=np.arange(3, dtype=np.int64),
        names=["aten::mm", "cudaLaunchKernel", "void gemm<4>(float*)"],
    )


# --- real traces -------------------------------------------------------------------------------

TRAIN = [
    "hta/queue_len_rank0_of16.json.gz",
    "hta/sampled_rank0_of128.json.gz",
    "tracelens/hf_qwen1.5-0.5b_h100.json.gz",
]
HELD_OUT = "hta/df_index_resolver_rank1_of2_216k_events.json.gz"


def slices_of(relative: str) -> list[Slice]:
    tree = build_tree(read_trace(real_trace(relative)))
    return step_slices(tree) if len(tree.steps) else root_slices(tree)


@pytest.fixture(scope="module")
def real_vocab() -> TPE:
    corpus = [s for relative in TRAIN for s in slices_of(relative)]
    return TPE.train(corpus, 1024)


def test_trained_on_real_files_it_decodes_another_exactly(real_vocab: TPE) -> None:
    held_out = slices_of(HELD_OUT)
    assert len(held_out) == 5

    for piece in held_out[:2]:
        tokens = real_vocab.encode(piece)
        assert real_vocab.decode(tokens) == piece
        # merges learned elsewhere still compress this file's steps
        assert tokens.reduction > 0.3
        assert np.all(tokens.dur_ns >= 0)
        assert np.all(tokens.depth == piece.depth[tokens.position[tokens.offsets[:-1]]])


def test_real_training_corpus_compresses_and_round_trips(real_vocab: TPE) -> None:
    corpus = slices_of(TRAIN[2])
    tokens = [real_vocab.encode(piece) for piece in corpus]

    assert all(real_vocab.decode(t) == p for t, p in zip(tokens, corpus, strict=True))
    assert np.mean([t.reduction for t in tokens]) > 0.6
    assert real_vocab.vocab_size <= 1024


def test_unseen_kinds_encode_to_their_layers_unk_token_and_keep_the_exact_name(
    real_vocab: TPE,
) -> None:
    piece = _small_slice()
    piece.names[2] = "void never_seen_kernel_xyz<7>(int)"
    piece.names[0] = "teller::made_up_op"

    tokens = real_vocab.encode(piece)

    kernel_unk = UNK_NAMES.index("<unk-kernel>")
    assert kernel_unk in tokens.kind.tolist() or len(tokens) < len(piece)
    assert real_vocab.kind_id(LAYER_CODE["kernel"], piece.names[2]) == LAYER_CODE["kernel"]
    assert real_vocab.kind_id(LAYER_CODE["cpu_op"], piece.names[0]) == LAYER_CODE["cpu_op"]
    decoded = real_vocab.decode(tokens)
    assert decoded == piece
    assert decoded.node_name(2) == "void never_seen_kernel_xyz<7>(int)"


def test_save_and_load_give_the_same_encoding(real_vocab: TPE, tmp_path: Path) -> None:
    path = tmp_path / "vocab.json"
    real_vocab.save(path)
    loaded = TPE.load(path)
    piece = slices_of(HELD_OUT)[0]

    assert loaded.vocab_size == real_vocab.vocab_size
    first, second = real_vocab.encode(piece), loaded.encode(piece)
    assert np.array_equal(first.kind, second.kind)
    assert loaded.decode(second) == piece
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.json"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"format": "other"}', "expected format"),
        (
            json.dumps(
                {
                    "format": "teller.tpe/1",
                    "layers": list(LAYER_CODE),
                    "base": [],
                    "merges": [[99, 0, 1, 0]],
                }
            ),
            "merge 0 refers to a token",
        ),
    ],
)
def test_a_bad_vocabulary_file_is_a_trace_error_naming_the_file(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "vocab.json"
    path.write_text(content)
    with pytest.raises(TraceError, match=message) as error:
        TPE.load(path)
    assert str(path) in str(error.value)


def optimizer_step_slice() -> Slice:
    """An optimizer step launching 256 identical ops (op → launch → kernel)."""
    count = 1 + 256 * 3
    parent = [-1]
    layers, names = [LAYER_CODE["engine"]], ["Optimizer.step#SGD.step"]
    for _ in range(256):  # op → launch → kernel, 256 times under the step
        op = len(parent)
        parent += [0, op, op + 1]
        layers += [LAYER_CODE["cpu_op"], LAYER_CODE["runtime"], LAYER_CODE["kernel"]]
        names += ["aten::add_", "cudaLaunchKernel", "void add_kernel<float>(float*)"]
    symbols = sorted(set(names))
    edge = [0] + [
        EDGE_LAUNCH if layers[i] == LAYER_CODE["kernel"] else EDGE_CALL for i in range(1, count)
    ]
    depth = [0] + [1, 2, 3] * 256
    piece = Slice(
        parent=np.asarray(parent, dtype=np.int32),
        edge=np.asarray(edge, dtype=np.int8),
        depth=np.asarray(depth, dtype=np.int32),
        layer=np.asarray(layers, dtype=np.int8),
        name=np.asarray([symbols.index(n) for n in names], dtype=np.int32),
        rank=np.zeros(count, dtype=np.int32),
        stream=np.where(np.asarray(layers) == LAYER_CODE["kernel"], 7, -1).astype(np.int32),
        start=np.arange(count, dtype=np.int64) * 1000,
        dur=np.full(count, 500, dtype=np.int64),
        self_ns=np.full(count, 500, dtype=np.int64),
        tree_node=np.arange(count, dtype=np.int64),
        names=symbols,
    )
    piece.validate()
    return piece


def test_a_run_of_identical_siblings_costs_log_merges_not_one_per_sibling() -> None:
    """Sibling merges double the run of ops each time: 8 merges for 256, not 256."""
    piece = optimizer_step_slice()

    tpe = TPE.train([piece], 64, min_count=1)
    tokens = tpe.encode(piece)

    assert len(tokens) == 1, "op→launch→kernel, then 2, 4, …, 256 of them, then under the step"
    assert len(tpe.merges) <= 2 + 8 + 1
    assert any(m.slot == SIBLING for m in tpe.merges)
    assert tpe.decode(tokens) == piece


def test_max_token_nodes_caps_what_one_token_stands_for() -> None:
    piece = optimizer_step_slice()

    tpe = TPE.train([piece], 64, min_count=1, max_token_nodes=12)
    tokens = tpe.encode(piece)

    assert max(tpe.pattern_length(t) for t in range(tpe.vocab_size)) == 12
    assert len(tokens) == 1 + 256 // 4, "the step, then 64 tokens of four ops each"
    assert tpe.decode(tokens) == piece


def _repeat_slice(pattern: list[tuple[str, str, int]], copies: int) -> Slice:
    """A step root with `copies` of one small subtree (layer, name, parent within the pattern)."""
    layers, names, parent = ["engine"], ["ProfilerStep#1"], [-1]
    for _ in range(copies):
        base = len(parent)
        for layer, name, up in pattern:
            layers.append(layer)
            names.append(name)
            parent.append(0 if up < 0 else base + up)
    symbols = sorted(set(names))
    count = len(parent)
    depth = [0] * count
    for i, p in enumerate(parent):
        if p >= 0:
            depth[i] = depth[p] + 1
    piece = Slice(
        parent=np.asarray(parent, dtype=np.int32),
        edge=np.asarray([0 if p < 0 else EDGE_CALL for p in parent], dtype=np.int8),
        depth=np.asarray(depth, dtype=np.int32),
        layer=np.asarray([LAYER_CODE[layer] for layer in layers], dtype=np.int8),
        name=np.asarray([symbols.index(n) for n in names], dtype=np.int32),
        rank=np.zeros(count, dtype=np.int32),
        stream=np.full(count, -1, dtype=np.int32),
        start=np.arange(count, dtype=np.int64) * 1000,
        dur=np.full(count, 500, dtype=np.int64),
        self_ns=np.full(count, 500, dtype=np.int64),
        tree_node=np.arange(count, dtype=np.int64),
        names=symbols,
        kind="step",
    )
    piece.validate()
    return piece


def test_slice_weighting_does_not_starve_a_small_steps_structure() -> None:
    """Plain counting merges the big step's pair first (seen 50 times, +25% R there); slice
    weighting the small step's pair (seen twice in 5 nodes: +40% R there)."""
    big = _repeat_slice(
        [
            ("cpu_op", "aten::mm", -1),
            ("runtime", "cudaLaunchKernel", 0),
            ("cpu_op", "aten::t", 0),
            ("cpu_op", "aten::view", 0),
        ],
        50,
    )
    small = _repeat_slice([("cpu_op", "aten::add", -1), ("cpu_op", "aten::empty", 0)], 2)

    def first_merge(weighting: str) -> tuple[str, str]:
        tpe = TPE.train([big, small], 64, weighting=weighting)
        for piece in (big, small):
            assert tpe.decode(tpe.encode(piece)) == piece
        merge = tpe.merges[0]
        return tpe.token_name(merge.parent), tpe.token_name(merge.child)

    assert first_merge("node")[0] == "cpu_op:aten::mm"
    assert first_merge("slice") == ("cpu_op:aten::add", "cpu_op:aten::empty")


def test_a_kind_seen_once_is_unknown_not_a_vocabulary_entry() -> None:
    piece = _repeat_slice([("cpu_op", "aten::mm", -1), ("runtime", "cudaLaunchKernel", 0)], 3)
    once = _repeat_slice([("cpu_op", "aten::only_once", -1)], 1)

    tpe = TPE.train([piece, once], 64)

    assert ("cpu_op", "aten::only_once") not in {(LAYERS[c], n) for c, n in tpe.base}
    tokens = tpe.encode(once)
    assert UNK_NAMES[LAYER_CODE["cpu_op"]] in {tpe.token_name(int(k)) for k in tokens.kind}
    assert tpe.decode(tokens) == once
