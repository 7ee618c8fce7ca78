"""The numeric localizer as a scoreboard method that explains its flagged steps.

Its verdict's words (`teller.rca.diagnose.localizer_explanations`: the sentence plans the
model's explanations are made of) reach the `Localization`, so the scoreboard judges them as it
judges the model's: fault type, faithfulness, well-formedness, agreement, excess explained. Its
steps and candidates are the localizer's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from teller.callchain.facts import RunFacts
from teller.callchain.tree import CallTree
from teller.localize import Localization, NumericLocalizer
from teller.rca.diagnose import localizer_explanations

if TYPE_CHECKING:
    from teller.align.host import HostSteps


class ExplainedLocalizer(NumericLocalizer):
    """`NumericLocalizer`, with its verdict's explanation of every flagged step."""

    def score(
        self, tree: CallTree, facts: RunFacts | None = None, host: HostSteps | None = None
    ) -> Localization:
        facts = RunFacts.of(tree, facts)
        localization = super().score(tree, facts)
        localization.explanations = localizer_explanations(tree, localization, facts, host=host)
        return localization
