"""How one decision changes from one policy set to another.

Shadow mode (a candidate beside every live decision) and `policy impact` (a
candidate over the logged decisions) both report it, so both take it from here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class DecisionChange(StrEnum):
    UNCHANGED = "unchanged"
    ALLOW_GAINED = "allow_gained"  # denied before, allowed now
    ALLOW_LOST = "allow_lost"  # allowed before, denied now
    REASONS_CHANGED = "reasons_changed"  # the same allow, other reasons


class Decided(Protocol):
    """A decision's answer: a `DecisionTrace`, or a logged `Verdict`."""

    @property
    def allow(self) -> bool: ...

    @property
    def reasons(self) -> list[str]: ...


def decision_change(before: Decided, after: Decided) -> DecisionChange:
    """What changed from before to after (reasons compared as sets)."""
    if before.allow != after.allow:
        return DecisionChange.ALLOW_GAINED if after.allow else DecisionChange.ALLOW_LOST
    if set(before.reasons) != set(after.reasons):
        return DecisionChange.REASONS_CHANGED
    return DecisionChange.UNCHANGED
