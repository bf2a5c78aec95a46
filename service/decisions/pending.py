"""`PendingDecision`: a request's decision on its way to the log, kept exactly once.

`authorize` makes one for every decision a request gets; the request then
settles it in one of three ways, and only the first counts: with the effect its
decision allowed (an approval granted or revoked), with a durable write or an
erasure (whose outcome the journal decides at commit), or, when the answer leaves without
either, with the answer's status alone. A decision that cannot be kept is
dropped with the request (nothing was done, and the log cannot take it now).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.decisions.journal import DecisionJournal, WriteResult
from service.decisions.log import DecisionEntryBody
from service.decisions.record_writes import StateErase
from store.key_codec import LaneKey
from store.record.state_record import SessionStateRecord
from store.session_state import Precondition


class DecisionAlreadyKept(RuntimeError):
    """A decision was settled twice: a bug in a route, never a client's doing."""


class PendingDecision:
    """One decision of one request, not in the log yet."""

    def __init__(self, body: DecisionEntryBody) -> None:
        self.body = body
        self._settled = False

    @property
    def settled(self) -> bool:
        """Kept in the log, or dropped: either way, nothing more to do."""
        return self._settled

    def record(self, journal: DecisionJournal, status: int) -> dict[str, Any]:
        """Keep the decision with the answer's status; nothing was changed."""
        self._settle()
        return journal.record(self.body, status=status)

    def record_effect(
        self,
        journal: DecisionJournal,
        status: int,
        puts: Sequence[tuple[LaneKey, bytes | None]] = (),
        *,
        approval_id: str | None = None,
    ) -> dict[str, Any]:
        """Keep the decision and commit what it changes, in one batch."""
        self._settle()
        return journal.record_effect(self.body, status=status, puts=puts, approval_id=approval_id)

    def record_write(
        self,
        journal: DecisionJournal,
        record: SessionStateRecord,
        precondition: Precondition,
        *,
        kept: int,
    ) -> WriteResult:
        """Keep the decision with the durable write it allowed, if the precondition holds
        (the session's newest `kept` versions are kept)."""
        self._settle()
        return journal.record_write(self.body, record, precondition, kept=kept)

    def record_erase(self, journal: DecisionJournal, erase: StateErase) -> WriteResult:
        """Keep the decision with the erasure it allowed, if the precondition holds."""
        self._settle()
        return journal.record_erase(self.body, erase)

    def drop(self) -> None:
        """Forget the decision: the request did nothing, and the log cannot take it now."""
        self._settled = True

    def _settle(self) -> None:
        if self._settled:
            raise DecisionAlreadyKept("a request's decision is kept once")
        self._settled = True
