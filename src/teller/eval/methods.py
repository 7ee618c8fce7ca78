"""The methods the scoreboard compares, by name; each builds a fresh, unfitted estimator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from teller.eval.baselines import FixedThreshold, GaussianMixtureBaseline, StepZScore
from teller.eval.localizer_method import ExplainedLocalizer
from teller.eval.log_baseline import LogOnlyBaseline


def _model(variant: str, pool_faults: bool = True) -> Callable[[], object]:
    """A shipped model variant; torch is imported only when a model row is actually run."""

    def make() -> object:
        from teller.rca.infer import variant_dir

        return checkpoint_method(variant_dir(variant), pool_faults)()

    return make


def checkpoint_method(checkpoint: Path, pool_faults: bool = True) -> Callable[[], object]:
    """The model method with the checkpoint in `checkpoint`: a shipped variant, or one of one's
    own (`teller train`'s output, a held-out-fault or held-out-shape checkpoint)."""

    def make() -> object:
        from teller.eval.model_method import RootCauseMethod

        return RootCauseMethod(checkpoint, pool_faults=pool_faults)

    return make


METHODS: dict[str, Callable[[], object]] = {
    "localizer": ExplainedLocalizer,  # with its verdict's explanations
    "threshold": FixedThreshold,
    "zscore": StepZScore,
    "gmm": GaussianMixtureBaseline,
    "logs": LogOnlyBaseline,
    "model": _model("model"),
    "model-no-logs": _model("no-logs"),
    "model-no-numeric": _model("no-numeric"),
    "model-raw-nodes": _model("raw-nodes"),
    # the default model with each flagged step's fault type its own (no pooling over the run)
    "model-step-faults": _model("model", pool_faults=False),
}
