"""Request trees on a real lab case, scored against the engine's own ground truth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from teller.align.logtime import place_log_times
from teller.align.requests import build_request_trees
from teller.callchain.tree import build_tree
from teller.ingest import read_run
from teller.ingest.logs import read_logs, request_key

CASE = Path(__file__).parent / "data" / "lab_none_tp2"


@pytest.fixture(scope="module")
def tree():
    return build_tree(read_run([CASE / "traces"]))


@pytest.fixture(scope="module")
def truth() -> list[dict]:
    return [json.loads(line) for line in (CASE / "ground_truth" / "steps.jsonl").open()]


def truth_pairs(truth) -> set[tuple[str, int]]:
    return {(request_key(r["request_id"]), s["step"]) for s in truth for r in s["requests"]}


def got_pairs(trees) -> set[tuple[str, int]]:
    keys = trees.requests.key
    return {(keys[i], s) for i, s in zip(trees.request.tolist(), trees.step.tolist(), strict=True)}


def test_trace_steps_are_the_engine_steps(tree, truth):
    rank0 = [k for k in range(len(tree.steps)) if tree.steps.rank[k] == 0]
    assert len(rank0) == len(truth) == 71
    assert [tree.steps.name[k] for k in rank0] == [s["annotation"] for s in truth]


def test_collector_logs_and_step_counts_recover_every_membership(tree, truth):
    logs = read_logs([CASE / "logs" / "rank0.log"])
    trees = build_request_trees(tree, logs=logs)
    assert len(trees.requests) == 34 and not trees.warnings
    expected = truth_pairs(truth)
    assert got_pairs(trees) == expected  # 675 (request, step) pairs, none missing, none extra
    assert trees.confidence.min() == 1.0
    prefill = {
        (request_key(r["request_id"]), s["step"])
        for s in truth
        for r in s["requests"]
        if r["phase"] == "prefill"
    }
    keys = trees.requests.key
    got_prefill = {
        (keys[i], s)
        for i, s, p in zip(trees.request.tolist(), trees.step.tolist(), trees.phase, strict=True)
        if p == "prefill"
    }
    assert got_prefill == prefill


def test_lifetime_windows_alone_keep_every_membership_at_lower_confidence(tree, truth):
    """Without the steps' request counts, queueing makes windows too wide: recall stays whole."""
    counts_hidden = build_tree(read_run([CASE / "traces"]), step_regex=r"^execute_")
    logs = read_logs([CASE / "logs" / "rank0.log"])
    trees = build_request_trees(counts_hidden, logs=logs)
    got, expected = got_pairs(trees), truth_pairs(truth)
    assert expected <= got and len(got) > len(expected)
    assert set(trees.confidence.tolist()) == {0.5}


def test_iteration_lines_state_the_counts_an_annotation_lacks(truth):
    """The same steps with their counts hidden: the anchored iteration lines print them."""
    counts_hidden = build_tree(read_run([CASE / "traces"]), step_regex=r"^execute_")
    assert (counts_hidden.steps.context_requests == -1).all()
    logs = read_logs([CASE / "logs" / "rank0.log"])
    times = place_log_times(counts_hidden, logs)
    trees = build_request_trees(counts_hidden, logs=logs, times=times)
    assert got_pairs(trees) == truth_pairs(truth)
    assert trees.confidence.min() == 1.0


def test_a_request_tree_has_its_step_subtree_on_every_rank(tree, truth):
    logs = read_logs([CASE / "logs" / "rank0.log"])
    trees = build_request_trees(tree, logs=logs)
    key = request_key(truth[10]["requests"][0]["request_id"])
    ordinals = trees.steps_of(key)
    subtrees = trees.step_subtrees(key, tree).to_pylist()
    assert [(row["step"], row["rank"]) for row in subtrees] == [
        (step, rank) for step in ordinals for rank in (0, 1)
    ]
    for row in subtrees:
        node = row["node"]
        assert tree.rank[node] == row["rank"] and tree.step[node] >= 0
        assert tree.steps.index[tree.step[node]] == row["step"]
        assert tree.names[tree.name[node]] == truth[row["step"]]["annotation"]
    assert trees.step_subtrees("no-such-request", tree).num_rows == 0


def write_spans(path: Path) -> Path:
    """The engine's recorded request times, exported as vLLM's OTLP `llm_request` spans would be."""
    spans = []
    for line in (CASE / "ground_truth" / "requests.jsonl").open():
        request = json.loads(line)
        arrival = request["arrival_ns"]

        def seconds(key: str, value: int) -> dict:
            return {"key": key, "value": {"doubleValue": value / 1e9}}

        spans.append(
            {
                "traceId": "0" * 32,
                "spanId": f"{len(spans):016x}",
                "name": "llm_request",
                "startTimeUnixNano": str(arrival),
                "endTimeUnixNano": str(request["finish_ns"]),
                "attributes": [
                    {"key": "gen_ai.request.id", "value": {"stringValue": request["request_id"]}},
                    seconds(
                        "gen_ai.latency.time_to_first_token", request["first_token_ns"] - arrival
                    ),
                    seconds("gen_ai.latency.e2e", request["finish_ns"] - arrival),
                ],
            }
        )
    export = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]}
    path.write_text(json.dumps(export))
    return path


def test_otel_request_spans_alone_recover_every_membership(tree, truth, tmp_path):
    from teller.ingest.otlp import read_spans

    spans = read_spans([write_spans(tmp_path / "spans.json")])
    trees = build_request_trees(tree, spans=spans)
    assert set(trees.requests.source) == {"otel"}
    assert got_pairs(trees) == truth_pairs(truth)
    prefill_steps = {
        trees.requests.key[i]: s
        for i, s, p in zip(trees.request.tolist(), trees.step.tolist(), trees.phase, strict=True)
        if p == "prefill"
    }
    first_steps = {}
    for s in truth:
        for r in s["requests"]:
            first_steps.setdefault(request_key(r["request_id"]), s["step"])
    assert prefill_steps == first_steps  # the step whose end is the first token


def test_a_span_with_the_engine_id_joins_the_api_id_the_logs_printed(tmp_path):
    """V1 exports the engine's id (client id plus `-<8 hex>`); the API server logs the client's."""
    from teller.align.requests import collect_requests
    from teller.ingest.otlp import read_spans

    log = tmp_path / "api.log"
    log.write_text(
        "(APIServer pid=1) INFO 02-13 11:33:33 [logger.py:49] Received request myreq: params: x\n"
    )
    arrival = 1_770_982_413_000_000_000  # 2026-02-13T11:33:33Z
    export = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "spanId": "a1",
                                "name": "llm_request",
                                "startTimeUnixNano": str(arrival + 200_000_000),
                                "endTimeUnixNano": str(arrival + 900_000_000),
                                "attributes": [
                                    {
                                        "key": "gen_ai.request.id",
                                        "value": {"stringValue": "myreq-a8a65d16"},
                                    }
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    (tmp_path / "spans.json").write_text(json.dumps(export))
    requests = collect_requests(read_logs([log], year=2026), read_spans([tmp_path / "spans.json"]))
    assert requests.key == ["myreq"] and requests.source == ["otel"]
