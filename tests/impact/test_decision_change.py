"""`decision_change`: the one comparison shadow mode and `policy impact` report."""

from __future__ import annotations

import pytest

from service.impact.report import Verdict
from service.policy.change import DecisionChange, decision_change


@pytest.mark.parametrize(
    ("before", "after", "change"),
    [
        (Verdict(allow=False, reasons=["a"]), Verdict(allow=True, reasons=[]), "allow_gained"),
        (Verdict(allow=True, reasons=[]), Verdict(allow=False, reasons=["a"]), "allow_lost"),
        (
            Verdict(allow=False, reasons=["a"]),
            Verdict(allow=False, reasons=["b"]),
            "reasons_changed",
        ),
        (
            Verdict(allow=False, reasons=["a", "b"]),
            Verdict(allow=False, reasons=["b", "a"]),
            "unchanged",
        ),
        (Verdict(allow=True, reasons=[]), Verdict(allow=True, reasons=[]), "unchanged"),
    ],
)
def test_a_change_is_named_by_allow_first_then_by_the_set_of_reasons(
    before: Verdict, after: Verdict, change: str
) -> None:
    assert decision_change(before, after) is DecisionChange(change)
