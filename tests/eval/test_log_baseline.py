"""The log-only baseline and the harness that hands it logs.

Tiny two-rank runs (tests/builders.py) get hand-written engine logs whose lines carry exact times
inside chosen steps, so what each step's lines say is known by construction; a simulated
kv_pressure case then checks the same on a recorded engine log with real preemption warnings.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ClassVar

import pytest

from builders import write_run
from teller.callchain.tree import CallTree
from teller.cli import main
from teller.eval.cases import Case, CaseLogs, Split, find_cases
from teller.eval.harness import evaluate
from teller.eval.log_baseline import LogOnlyBaseline
from teller.eval.methods import METHODS
from teller.labels import CaseLabels
from teller.localize import Localization

#: Where the builders' steps sit on the trace clock: step k spans FIRST_STEP_NS + k·STEP_PERIOD_NS
#: for STEP_DUR_NS (ns since the epoch, as `write_run` lays them out).
FIRST_STEP_NS = 1_000_001
STEP_PERIOD_NS = 276_000
STEP_DUR_NS = 268_000
HEARTBEAT = "INFO 01-01 00:00:00 [core.py:10] Engine heartbeat: queue ok"
WARNING = "WARNING 01-01 00:00:00 [cache.py:99] Cache flush took longer than expected"


def stamp(step: int, share: float) -> str:
    """A collector-style exact time `share` of the way into a builder step."""
    ns = FIRST_STEP_NS + STEP_PERIOD_NS * step + int(STEP_DUR_NS * share)
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns / 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_case(
    root: Path,
    name: str,
    fault: str = "none",
    steps: list[int] | None = None,
    warnings: dict[int, str] | None = None,
    bursts: dict[int, int] | None = None,
    logs: bool = True,
) -> Path:
    """A tiny labelled case: one heartbeat line per step, `warnings[step]` = the process printing
    a warning in that step, `bursts[step]` = that many extra heartbeats in it."""
    case = root / name
    (case / "traces").mkdir(parents=True)
    write_run(case / "traces")
    CaseLabels(
        case_id=name,
        source="lab",
        fault=fault,
        view="V" if fault != "none" else "-",
        guilty_rank=None if fault == "none" else 1,
        guilty_operator=None if fault == "none" else "aten::mm",
        window_ns=None,
        steps=steps or [],
        intensity=1.0,
        seed=0,
        explanation="test case",
    ).write(case)
    if logs:
        lines = [f"{stamp(s, 0.2)} (EngineCore_0 pid=7) {HEARTBEAT}" for s in range(12)]
        for step, process in (warnings or {}).items():
            lines.append(f"{stamp(step, 0.6)} ({process} pid=8) {WARNING}")
        for step, extra in (bursts or {}).items():
            lines += [
                f"{stamp(step, 0.3 + 0.05 * j)} (EngineCore_0 pid=7) {HEARTBEAT}"
                for j in range(extra)
            ]
        (case / "logs").mkdir()
        (case / "logs" / "server.log").write_text("\n".join(sorted(lines)) + "\n")
    return case


def fitted_on_normal(root: Path, count: int = 2) -> LogOnlyBaseline:
    trees, logs = [], []
    for seed in range(count):
        case = Case(write_case(root, f"normal{seed}"), CaseLabels.read(root / f"normal{seed}"))
        trees.append(case.tree())
        logs.append(case.logs(trees[-1]))
    return LogOnlyBaseline().fit(trees, normal_logs=logs)


def scored(method: LogOnlyBaseline, path: Path) -> tuple[CallTree, Localization]:
    case = Case(path, CaseLabels.read(path))
    tree = case.tree()
    return tree, method.score(tree, logs=case.logs(tree))


def flagged(localization: Localization) -> list[int]:
    return [s.iteration for s in localization.anomalous_steps()]


def test_a_warning_never_seen_in_normal_logs_flags_its_steps(tmp_path: Path) -> None:
    method = fitted_on_normal(tmp_path)
    warned = {6: "EngineCore_0", 7: "EngineCore_0"}
    _, localization = scored(
        method, write_case(tmp_path, "warned", "slow_operator", [6, 7], warned)
    )
    assert flagged(localization) == [6, 7]
    assert len(localization.steps) == 12
    for step in (6, 7):  # no line names an operator: the slowest rank's top self-time operator
        assert localization.candidates[step][0].operator == "aten::mm"


def test_a_rank_tagged_warning_names_its_rank(tmp_path: Path) -> None:
    method = fitted_on_normal(tmp_path)
    _, localization = scored(
        method, write_case(tmp_path, "tagged", "slow_operator", [5], {5: "Worker_TP1"})
    )
    assert flagged(localization) == [5]
    top = localization.candidates[5][0]
    assert (top.operator, top.rank) == ("aten::mm", 1)


def test_a_burst_of_a_usual_line_flags_its_step_and_a_few_extra_do_not(tmp_path: Path) -> None:
    method = fitted_on_normal(tmp_path)
    _, burst = scored(method, write_case(tmp_path, "burst", "slow_operator", [9], bursts={9: 8}))
    assert flagged(burst) == [9]
    _, few = scored(method, write_case(tmp_path, "few", "slow_operator", [9], bursts={9: 2}))
    assert flagged(few) == []


def test_without_logs_nothing_is_flagged(tmp_path: Path) -> None:
    method = fitted_on_normal(tmp_path)
    path = write_case(tmp_path, "silent", "slow_operator", [6], logs=False)
    case = Case(path, CaseLabels.read(path))
    tree = case.tree()
    assert case.logs(tree) == CaseLogs(paths=[], aligned=None)
    for logs in (case.logs(tree), None):
        localization = method.score(tree, logs=logs)
        assert len(localization.steps) == 12 and flagged(localization) == []
    unfitted = LogOnlyBaseline().fit([tree], normal_logs=[case.logs(tree)])
    assert flagged(unfitted.score(tree, logs=None)) == []


class Recorder:
    """A method that notes what the harness handed it."""

    calls: ClassVar[list[tuple[str, object]]] = []

    def fit(self, normal_trees: list[CallTree], **kwargs: object) -> Recorder:
        self.calls.append(("fit", kwargs))
        return self

    def score(self, tree: CallTree, **kwargs: object) -> Localization:
        self.calls.append(("score", kwargs))
        return Localization(steps=[], candidates={})


class LogRecorder(Recorder):
    uses_logs = True


def test_harness_hands_aligned_logs_only_to_methods_that_read_them(tmp_path: Path) -> None:
    write_case(tmp_path, "normal0")
    write_case(tmp_path, "warned", "slow_operator", [6], {6: "EngineCore_0"})
    cases = find_cases([tmp_path])
    Recorder.calls = []
    evaluate(
        {"plain": Recorder, "reader": LogRecorder},
        cases,
        Split(train=["normal0"], test=["warned"]),
        progress=False,
    )
    plain_fit, reader_fit, plain_score, reader_score = Recorder.calls
    assert plain_fit == ("fit", {}) and plain_score == ("score", {})
    (normal_logs,) = reader_fit[1]["normal_logs"]
    shared = reader_score[1]["logs"]
    assert normal_logs.paths == [tmp_path / "normal0" / "logs" / "server.log"]
    assert shared.aligned is not None and len(shared.aligned.logs) == 13


def test_logs_row_through_the_harness(tmp_path: Path) -> None:
    for seed in range(2):
        write_case(tmp_path, f"normal{seed}")
    write_case(tmp_path, "quiet")
    write_case(tmp_path, "warned", "slow_operator", [6, 7], {6: "EngineCore_0", 7: "EngineCore_0"})
    split = Split(train=["normal0", "normal1"], test=["quiet", "warned"])
    result = evaluate({"logs": METHODS["logs"]}, find_cases([tmp_path]), split, progress=False)
    overall = next(r for r in result.rows if r.group == "overall")
    assert overall.step_precision == 1.0 and overall.step_recall == 1.0
    assert overall.false_alarm_rate == 0.0


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two normal simulated runs and one whose shrunken KV cache makes the engine preempt
    requests (vLLM's real preemption warning, inside the labelled window)."""
    root = tmp_path_factory.mktemp("sim")
    base = ["-q", "lab", "sim", "--nodes", "1", "--gpus-per-node", "2", "--tp", "2"]
    base += ["--steps", "40", "--window", "15:30"]
    for name, extra in (
        ("none1", ["--fault", "none", "--seed", "1"]),
        ("none2", ["--fault", "none", "--seed", "2"]),
        ("kv", ["--fault", "kv_pressure", "--intensity", "2", "--seed", "5"]),
    ):
        assert main([*base, "--out", str(root / name), *extra]) == 0
    return root


def test_preemption_warnings_in_a_simulated_engine_log_flag_their_steps(simulated: Path) -> None:
    """Every step with a preemption warning is flagged and nothing before the fault is; steps
    after the window may be (requests preempted in it resume there, a line normal runs never
    print): that is what the logs alone say."""
    cases = {case.case_id: case for case in find_cases([simulated])}
    trees = {name: case.tree() for name, case in cases.items()}
    logs = {name: cases[name].logs(trees[name]) for name in cases}
    method = LogOnlyBaseline().fit(
        [trees["none1"], trees["none2"]], normal_logs=[logs["none1"], logs["none2"]]
    )
    faulty = method.score(trees["kv"], logs=logs["kv"])
    aligned = logs["kv"].aligned
    assert aligned is not None
    events = aligned.logs.table.column("event").to_pylist()
    warned = {
        int(aligned.alignment.step[i]) for i, e in enumerate(events) if e == "request_preempted"
    }
    labelled = set(cases["kv"].labels.steps)
    assert warned and warned <= labelled
    assert warned <= set(flagged(faulty))
    assert min(flagged(faulty)) >= min(labelled)
    assert all(faulty.candidates[s] for s in flagged(faulty))
    for name in ("none1", "none2"):  # fitted on both: neither has a step to flag
        assert flagged(method.score(trees[name], logs=logs[name])) == []
