"""The verdict's explanations on a recorded straggler case: sentence plans, the heads' fault and
rank, measured numbers, no repeated words or fragments, one incident for one cause."""

from __future__ import annotations

import itertools
import re
from collections import Counter

import pytest

from teller.analysis import Analysis
from teller.callchain.render import format_ns
from teller.eval.metrics import agreement
from teller.labels import CaseLabels
from teller.rca.diagnose import incidents, worst_of
from teller.rca.infer import DEFAULT_MODEL, LoadedModel
from teller.rca.plans import PLANS, parse
from teller.rca.verdict import Verdict

from .conftest import small_case


def _model_loads() -> bool:
    try:
        LoadedModel.load(DEFAULT_MODEL)
    except Exception:  # an old checkpoint format, or none
        return False
    return True


@pytest.fixture(scope="module", params=["localizer", "model"])
def straggler(request) -> tuple[Verdict, Analysis, CaseLabels]:
    if request.param == "model" and not _model_loads():
        pytest.skip("no loadable default model")
    case = small_case("straggler", rank=1, seed=11, gpus=4)
    run = Analysis(case, method=request.param)
    return run.diagnose(), run, CaseLabels.read(case)


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z][\w':-]*|\d+(?:\.\d+)?", text)


def test_every_explanation_is_plans_stating_the_heads_fault_and_rank(straggler):
    verdict, _, labels = straggler
    window = [f for f in verdict.findings if f.step in labels.steps]
    assert window
    for f in verdict.findings:
        said = parse(f.explanation)
        assert said is not None, f.explanation
        assert agreement(f.explanation, f.fault_type, f.operator, f.rank).agrees
        stated = {PLANS[s.plan].fault for s in said} - {None}
        assert stated <= {f.fault_type}
    right = [f for f in window if f.fault_type == "straggler"]
    assert right and all(f.rank == labels.guilty_rank for f in right)
    for f in right:
        assert f"This points to rank {f.rank} as a straggler" in f.explanation
        assert re.search(rf"Rank {f.rank} arrived \S+ \S+ late in total at \d+ ", f.explanation)
        assert "its peers waited" in f.explanation


def test_the_numbers_are_the_measured_ones(straggler):
    verdict, run, _ = straggler
    steps = run.tree.steps
    own = {
        (int(steps.rank[k]), int(steps.index[k])): int(steps.dur_ns[k]) for k in range(len(steps))
    }
    for f in verdict.findings:
        said = parse(f.explanation)
        observed = said[0]
        if observed.plan == "observed.slow":  # the duration beside the rank is that rank's
            assert observed.slots["rank"] == str(f.rank)
            assert observed.slots["dur"] == format_ns(own[(f.rank, f.step)])
            assert observed.slots["expected"] == format_ns(f.step_expected_ns)
        evidence = said[1]
        if "observed" in evidence.slots and f.evidence:
            assert evidence.slots["observed"] == format_ns(f.evidence[0].observed_ns)
        # numbers appear only in slots: the templates hold none
        template_text = " ".join(PLANS[s.plan].template for s in said)
        assert not re.search(r"\d", re.sub(r"\{\w+\}", "", template_text))


def test_no_repeated_words_or_fragments(straggler):
    verdict, _, _ = straggler
    for f in verdict.findings:
        words = [w.lower() for w in _words(f.explanation)]
        assert all(a != b for a, b in itertools.pairwise(words)), f.explanation
        sentences = [s.strip() for s in re.split(r"(?<=\.) (?=[A-Z])", f.explanation)]
        assert len(sentences) == len(set(sentences))
        plain = [w for w in words if not re.match(r"\d", w)]
        grams = Counter(tuple(plain[i : i + 6]) for i in range(len(plain) - 5))
        assert not [g for g, n in grams.items() if n > 1], f.explanation


def test_one_cause_is_one_incident_and_the_worst_step_lost_the_most(straggler):
    verdict, _, labels = straggler
    groups = incidents([f for f in verdict.findings if f.step in labels.steps])
    assert groups[0][0].rank == labels.guilty_rank
    blamed = Counter(f.rank for f in verdict.findings if f.fault_type == "straggler")
    assert set(blamed) <= {labels.guilty_rank}  # its peers are not blamed for its symptom
    for group in incidents(verdict.findings):
        worst = worst_of(group)
        assert all(
            worst.step_dur_ns - worst.step_expected_ns >= f.step_dur_ns - f.step_expected_ns
            for f in group
        )
