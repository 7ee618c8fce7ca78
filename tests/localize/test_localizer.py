"""The localizer on small hand-built two-rank runs whose answer is known by construction.

Real recorded cases (lab and simulator) exercise it end to end in the evaluation tests; here each
mechanism is pinned on its own: step expectation by composition, compute excess, arrival.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from builders import STEPS, write_run
from teller.callchain.facts import RunFacts
from teller.callchain.tree import build_tree
from teller.ingest import read_run
from teller.localize import NumericLocalizer


def localize(paths: list[Path], normal: list[Path] | None = None):
    localizer = NumericLocalizer()
    if normal:
        localizer.fit([build_tree(read_run(normal))])
    tree = build_tree(read_run(paths))
    return tree, localizer.score(tree)


def test_quiet_run_flags_nothing(tmp_path: Path) -> None:
    _, result = localize(write_run(tmp_path))
    assert len(result.steps) == STEPS
    assert result.anomalous_steps() == []


def test_slow_operator_on_one_rank_is_found(tmp_path: Path) -> None:
    _, result = localize(write_run(tmp_path, slow_mm={(1, 7): 4.0, (1, 8): 4.0}))
    assert [s.iteration for s in result.anomalous_steps()] == [7, 8]
    top = result.candidates[7][0]
    assert (top.rank, top.operator, top.kind) == (1, "aten::mm", "compute")
    # the peer's all-reduce wait is a symptom, never a candidate
    assert all(c.operator != "gloo:all_reduce" or c.rank == 1 for c in result.candidates[7])


def test_late_arrival_names_the_straggler_not_the_waiting_peer(tmp_path: Path) -> None:
    _, result = localize(write_run(tmp_path, late={(0, 5): 400}))
    assert [s.iteration for s in result.anomalous_steps()] == [5]
    top = result.candidates[5][0]
    assert (top.rank, top.operator, top.kind) == (0, "gloo:all_reduce", "arrival")


def test_longer_prefill_is_not_an_anomaly(tmp_path: Path) -> None:
    long_prompts = {s: 64 * (1 + s % 4) for s in range(STEPS)}  # 64..256 tokens, mm scales with it
    (tmp_path / "normal").mkdir()
    normal = write_run(tmp_path / "normal", tokens=long_prompts)
    shifted = {s: 512 for s in (9, 10, 11)}
    (tmp_path / "case").mkdir()
    case = write_run(tmp_path / "case", tokens={**long_prompts, **shifted})
    _, result = localize(case, normal=normal)
    assert result.anomalous_steps() == []


def test_normal_runs_of_another_setup_are_not_the_reference(tmp_path: Path) -> None:
    """Step models come only from normal runs of the same setup (rank count, operator names)."""
    (tmp_path / "same").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "case").mkdir()
    same = write_run(tmp_path / "same")
    other = write_run(tmp_path / "other")
    for path in other:  # another model: other operators
        path.write_text(path.read_text().replace("aten::mm", "aten::bmm"))
    case = build_tree(read_run(write_run(tmp_path / "case")))
    localizer = NumericLocalizer().fit([build_tree(read_run(other))])
    assert localizer.step_models(RunFacts(case)) == {}
    localizer = NumericLocalizer().fit([build_tree(read_run(other)), build_tree(read_run(same))])
    assert set(localizer.step_models(RunFacts(case))) == {"prefill"}


def test_usual_noise_in_arrivals_does_not_outrank_a_consistent_slowdown(tmp_path: Path) -> None:
    """Every step one rank or the other reaches the all-reduce 500 µs late by chance (host-bound
    ranks do); in steps 7-8 rank 1's mm is 1.5x slower (about 100 µs in all). The consistent
    slowdown, not the usual arrival noise that happens to be larger in µs, is the top suspect."""
    noise = {(s % 2, s): 500 for s in range(STEPS)}
    _, result = localize(write_run(tmp_path, late=noise, slow_mm={(1, 7): 1.5, (1, 8): 1.5}))
    for step in (7, 8):
        assert step in [s.iteration for s in result.anomalous_steps()]
        top = result.candidates[step][0]
        assert (top.rank, top.operator, top.kind) == (1, "aten::mm", "compute")


def test_candidates_for_every_step_leave_the_flagged_steps_and_their_ranking_alone(
    tmp_path: Path,
) -> None:
    """`candidate_z` proposes operators for quiet steps too (the root-cause model's input); the
    steps flagged and the references their operators are measured against do not change."""
    tree = build_tree(read_run(write_run(tmp_path, slow_mm={(1, 7): 4.0, (1, 8): 4.0})))
    usual = NumericLocalizer().score(tree)
    every = NumericLocalizer(candidate_z=float("-inf")).score(tree)
    assert [s.iteration for s in every.anomalous_steps()] == [7, 8]
    assert set(every.candidates) == {s.iteration for s in every.steps}
    for iteration in (7, 8):
        assert every.candidates[iteration] == usual.candidates[iteration]
    # a quiet step is measured against the other quiet steps, not against itself: nothing in it
    # stands out by much
    quiet = [c for it, found in every.candidates.items() if it not in (7, 8) for c in found]
    assert all(c.observed_ns < 2 * max(c.normal_ns, 1) for c in quiet if c.kind == "compute")


def test_the_median_of_a_short_list_is_numpys() -> None:
    import numpy as np

    from teller.localize.candidates import _small_median

    rng = np.random.default_rng(0)
    for n in range(1, 12):
        values = rng.integers(0, 1000, n).tolist()
        assert _small_median(values) == float(np.median(values))


@pytest.mark.parametrize("graphs", [True, False])
def test_a_swapped_kernel_is_a_candidate_on_every_step_that_runs_it(graphs: bool) -> None:
    """Every labelled kernel_regression step offers the swapped-in kernel on the guilty rank, its
    whole time as excess: the step scores flag none of these steps, so the fault's own steps are
    the reference of the others (with CUDA graphs, 8 eager steps in a row; eagerly, all 20 of the
    window), and idle gaps elsewhere in the step outscore it."""
    from lab.test_sim_cases import case
    from teller.labels import CaseLabels
    from teller.localize import FRESH

    out, _, tree = case(fault="kernel_regression", rank=0, graphs=graphs, seed=2)
    labels = CaseLabels.read(out)
    localization = NumericLocalizer(candidate_z=float("-inf")).score(tree)
    flagged = {s.iteration for s in localization.steps if s.anomalous}
    assert len(set(labels.steps) - flagged) > len(labels.steps) // 2
    for step in labels.steps:
        named = [
            c
            for c in localization.candidates[step]
            if (c.operator, c.rank) == (labels.guilty_operator, labels.guilty_rank)
        ]
        assert named and named[0].reference in FRESH, step
        assert named[0].score == named[0].observed_ns  # its whole time is the excess
