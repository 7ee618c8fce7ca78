"""A run of several engines analysed one engine at a time (`teller.callchain.split`,
`Analysis(by_engine=True)`): the same steps, nodes and breakdown as the whole run's analysis,
one engine's tree held at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from builders import two_tp2_replicas
from conftest import real_trace
from teller.analysis import Analysis
from teller.callchain.engines import EnginePlace
from teller.cli import main
from teller.labels import CaseLabels
from teller.rca.diagnose import headline_finding

RESNET = "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz"
RESOLVER = "hta/df_index_resolver_rank1_of2_216k_events.json.gz"
SAMPLED = ("hta/sampled_rank0_of128.json.gz", "hta/sampled_rank1_of128.json.gz")


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_tp2_replicas(tmp_path_factory.mktemp("by_engine") / "case")


@pytest.fixture(scope="module")
def whole_and_split(two_replicas: Path) -> tuple[Analysis, Analysis]:
    whole = Analysis(two_replicas, method="localizer", by_engine=False)
    split = Analysis(two_replicas, method="localizer", by_engine=True, jobs=2)
    whole.diagnose(), split.diagnose()
    return whole, split


def test_a_run_of_two_engines_is_cut_into_them(whole_and_split) -> None:
    _, split = whole_and_split
    parts = split.split.parts
    assert [p.ranks for p in parts] == [[0, 1], [2, 3]]
    assert [p.place for p in parts] == [EnginePlace(0, 1000), EnginePlace(1, 1000)]
    assert [[f.name for f in p.files] for p in parts] == [
        ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"],
        ["rank2.pt.trace.json.gz", "rank3.pt.trace.json.gz"],
    ]
    assert [[f.name for f in split._engine_logs.files_of(e)] for e in (0, 1)] == [
        ["server0.log"],
        ["server1.log"],
    ]
    assert "tree" not in vars(split)  # the whole run's tree was never built


def test_each_engine_keeps_the_whole_runs_steps_nodes_and_breakdown(whole_and_split) -> None:
    whole, split = whole_and_split
    verdict = split.diagnose()

    def step_facts(rows):
        return [(r.rank, r.step, r.name, r.kind, r.start_ns, r.dur_ns) for r in rows]

    assert step_facts(verdict.steps) == step_facts(whole.diagnose().steps)
    assert split.breakdown().to_json() == whole.breakdown().to_json()
    assert split.breakdown().to_arrow().equals(whole.breakdown().to_arrow())
    tree = whole.tree
    named = [f for f in verdict.findings if f.operator_node is not None]
    assert named
    for finding in named:  # the node the run's tree numbers so is the finding's operator
        assert tree.node_name(finding.operator_node) == finding.operator
        assert int(tree.rank[finding.operator_node]) == finding.rank
        for candidate in finding.candidates:
            assert tree.node_name(candidate["node"]) == candidate["operator"]


def test_the_fault_in_the_second_engine_is_found_there(two_replicas, whole_and_split) -> None:
    whole, split = whole_and_split
    labelled = CaseLabels.read(two_replicas).keyed_to(whole.tree.steps).steps
    assert labelled == list(range(1012, 1018))
    findings = split.diagnose().findings
    named = [f for f in findings if f.step in labelled and f.rank == 3]
    assert len(named) >= 4 and all(f.operator.startswith("sm90_xmma_gemm") for f in named)
    assert not {f.step for f in findings} & set(range(12, 18))
    warnings = split.diagnose().warnings
    assert warnings[0].startswith("2 engines in one run")
    assert any(w.startswith("engine 1: server1.log") for w in warnings)
    assert all(w.startswith(("2 engines", "engine ", "each engine: ")) for w in warnings)


def test_a_node_numbered_for_the_run_maps_back_to_its_engine(whole_and_split) -> None:
    whole, split = whole_and_split
    part = split.split.parts[1]
    engine = split._engine_analysis(part)
    nodes = np.arange(0, len(engine.tree), 997)
    run_nodes = part.run_nodes(engine.tree, nodes)
    assert [part.engine_node(int(n)) for n in run_nodes] == nodes.tolist()
    names = [whole.tree.node_name(int(n)) for n in run_nodes]
    assert names == [engine.tree.node_name(int(n)) for n in nodes]
    assert split.split.parts[0].engine_node(int(run_nodes[0])) is None


def test_the_html_report_draws_the_headline_findings_engine(tmp_path, whole_and_split) -> None:
    _, split = whole_and_split
    worst = headline_finding(split.diagnose().findings)
    text = split.report(tmp_path / "report.html").read_text()
    assert f"Call-chain tree of step {worst.step}" in text
    assert "suspect" in text and worst.operator[:30] in text


def test_the_cli_cuts_a_run_by_engine_on_request(two_replicas, tmp_path, capsys) -> None:
    """Each engine's breakdown rows are written as they were kept, on disk: the JSON's
    breakdown is the whole run's, byte for byte."""
    args = ["-q", "analyze", str(two_replicas), "--method", "localizer", "--jobs", "1"]
    assert main([*args, "--by-engine", "-o", str(tmp_path / "split.json")]) == 0
    assert "on rank 3" in capsys.readouterr().out
    assert main([*args, "--no-by-engine", "-o", str(tmp_path / "whole.json")]) == 0
    split, whole = ((tmp_path / f"{n}.json").read_text() for n in ("split", "whole"))
    assert '"2 engines in one run' in split
    assert split[split.index('"breakdown"') :] == whole[whole.index('"breakdown"') :]


def test_a_log_naming_two_engines_keeps_the_run_whole(two_replicas, tmp_path) -> None:
    mixed = tmp_path / "mixed.log"
    mixed.write_text(
        "".join((two_replicas / "logs" / f"server{e}.log").read_text() for e in (0, 1))
    )
    run = Analysis(two_replicas, logs=[mixed], method="localizer", by_engine=True)
    assert run.split is None


def test_real_captures_of_two_jobs_are_analysed_one_at_a_time() -> None:
    paths = [real_trace(RESNET), real_trace(RESOLVER)]
    whole = Analysis(paths, method="localizer", by_engine=False)
    split = Analysis(paths, method="localizer", by_engine=True)
    assert [p.ranks for p in split.split.parts] == [[0], [1]]
    verdict = split.diagnose()
    assert {r.step >= 1000 for r in verdict.steps if r.rank == 1} == {True}
    assert [(r.rank, r.step, r.dur_ns) for r in verdict.steps] == [
        (r.rank, r.step, r.dur_ns) for r in whole.diagnose().steps
    ]
    assert split.breakdown().to_json() == whole.breakdown().to_json()


def test_real_ranks_of_one_job_are_never_cut() -> None:
    paths = [real_trace(p) for p in SAMPLED]
    split = Analysis(paths, method="localizer", by_engine=True)
    assert split.split is None
    whole = Analysis(paths, method="localizer", by_engine=False)
    assert split.diagnose() == whole.diagnose()


def test_each_engine_is_loaded_from_the_kept_forests_not_parsed_again(
    two_replicas, monkeypatch
) -> None:
    import teller.callchain.per_rank as per_rank

    run = Analysis(two_replicas, method="localizer", jobs=1)  # by engine is the default
    assert [len(p.kept) for p in run.split.parts] == [2, 2]

    def refuse(path: Path):
        raise AssertionError(f"{path} parsed a second time")

    monkeypatch.setattr(per_rank, "file_forest", refuse)
    assert run.diagnose().findings


def test_engines_whose_forests_were_not_kept_are_read_again(
    two_replicas, whole_and_split, monkeypatch
) -> None:
    """A Ray worker on another machine cannot see the folder the forests go to: it keeps none,
    and each engine's files are parsed again, to the same verdict."""
    import teller.analysis as analysis
    from teller.callchain.split import file_steps

    def unseen(path: Path, step_regex: str | None = None, keep_in: Path | None = None):
        return file_steps(path, step_regex, keep_in=Path("/nonexistent/teller-forests"))

    monkeypatch.setattr(analysis, "file_steps", unseen)
    run = Analysis(two_replicas, method="localizer", jobs=1)
    assert [p.kept for p in run.split.parts] == [{}, {}]
    _, split = whole_and_split
    assert run.diagnose() == split.diagnose()


def test_the_model_on_engines_held_whole_says_so(two_replicas) -> None:
    """Its inputs are one engine's; held whole, a run of several can mislead it."""
    whole = Analysis(two_replicas, by_engine=False).diagnose()
    assert any("the root-cause model read 2 engines held whole" in w for w in whole.warnings)
    split = Analysis(two_replicas).diagnose()
    assert not any("held whole" in w for w in split.warnings)
