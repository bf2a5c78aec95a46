"""`DecisionGroups`: decisions asked of OPA as the journal groups commits.

A request that needs a decision while no query is in flight asks for it at once,
on its own, as before (a batch of one adds no wait). Requests that need one while
a query is in flight queue; when that query is answered, its asker hands the lead
to the oldest of them, which asks for every queued decision (up to `max_items`)
in one query of `sessionstate.batch` (`service.policy.batch`): one HTTP round
trip, one pass of OPA's authorization and one event of OPA's decision log for
all of them. Each item is still decided alone, by its own package with its own
input (`with input as`), and gets its own answer: OPA's decision id of the query
and the item's index (`ItemAnswer`), so each decision's entry joins with OPA's
log.

Failing closed stays per item: an item the batch's result leaves undefined is
undefined (`policy_decision_undefined`), and a query that fails, times out or is
cut short fails every item in it, as a single query fails its one. A batch that
OPA refuses (403: an authorization policy that does not let the service ask
`sessionstate.batch`) or answers without a result (a policy set served without
the batch module: an OPA of the operator's, a bundle signed by an older
version) is not a decision: each of its items is asked again on its own, and
queries go one decision each for `FALLBACK_SECONDS`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.policy.batch import LIVE_BATCH_PACKAGE, encoded_batch

# Queries in flight at once: more let OPA's two threads overlap but make batches smaller;
# 2 and 4 served no more reads than 1 (docs/performance.md, Grouped decisions).
IN_FLIGHT = 1
MAX_ITEMS = 64  # decisions per query: a batch's input stays well under OPA's body limit
FALLBACK_SECONDS = 30.0  # after a batch OPA would not decide: one decision per query
ASK_ALONE = object()  # an item's answer: not decided in its batch, to be asked on its own


@dataclass(frozen=True, slots=True)
class ItemAnswer:
    """OPA's answer to one item of a batch, shaped as its answer to a single query, with
    where it was decided: the batch query's decision id is the answer's `decision_id`."""

    answer: dict[str, Any]
    index: int
    size: int


Query = Callable[[str, bytes], Any]  # (package, encoded input) -> OPA's answer, as a transport


@dataclass(slots=True)
class _Ask:
    package: str
    encoded: bytes
    wake: threading.Event = field(default_factory=threading.Event)
    answer: Any = None
    settled: bool = False


class DecisionGroups:
    """At most `in_flight` queries at a time; what arrives meanwhile goes in the next, together."""

    def __init__(
        self, query: Query, *, max_items: int = MAX_ITEMS, in_flight: int = IN_FLIGHT
    ) -> None:
        self._query = query
        self._max_items = max_items
        self._most_in_flight = in_flight
        self._lock = threading.Lock()
        self._waiting: deque[_Ask] = deque()
        self._in_flight = 0
        self._alone_until = 0.0  # monotonic: until then, every decision on its own
        self.batches = 0  # queries of more than one decision asked (for the bench and tests)
        self.fallbacks = 0  # batches OPA would not decide, asked again one by one

    def ask(self, package: str, encoded: bytes) -> Any:
        """OPA's answer for one decision: a dict (an `ItemAnswer` when it was decided in a
        batch), `REFUSED`, or None, as the transport answers a single query."""
        if time.monotonic() < self._alone_until:
            return self._query(package, encoded)
        ask = _Ask(package, encoded)
        with self._lock:
            lead = self._in_flight < self._most_in_flight
            if lead:
                self._in_flight += 1
            else:
                self._waiting.append(ask)
        if not lead:
            ask.wake.wait()
        if not ask.settled:  # it leads: at once, or handed the lead by the query before
            self._lead(ask)
        return self._query(package, encoded) if ask.answer is ASK_ALONE else ask.answer

    def _lead(self, first: _Ask) -> None:
        batch = [first]
        with self._lock:
            while self._waiting and len(batch) < self._max_items:
                batch.append(self._waiting.popleft())
        try:
            answers = self._answers(batch)
        except Exception:  # whatever went wrong, nothing was decided: deny each
            answers = [None] * len(batch)
        for ask, answer in zip(batch, answers, strict=True):
            ask.answer, ask.settled = answer, True
        with self._lock:
            following = self._waiting.popleft() if self._waiting else None
            if following is None:
                self._in_flight -= 1
        for ask in batch[1:]:
            ask.wake.set()
        if following is not None:
            following.wake.set()  # not settled: it leads the next query

    def _answers(self, batch: list[_Ask]) -> list[Any]:
        if len(batch) == 1:
            return [self._query(batch[0].package, batch[0].encoded)]
        self.batches += 1
        body = encoded_batch([(ask.package, ask.encoded) for ask in batch])
        return self._split(self._query(LIVE_BATCH_PACKAGE, body), len(batch))

    def _split(self, answer: Any, size: int) -> list[Any]:
        """The batch's answer as each item's; ASK_ALONE for every item when OPA would not
        decide the batch at all."""
        if not isinstance(answer, dict):
            if answer is None:
                return [None] * size  # OPA failed: as a single query would
            return self._fall_back(size)  # refused: the batch was not allowed
        result = answer.get("result")
        if not isinstance(result, dict):
            return self._fall_back(size)  # no batch module in force: undefined as a whole
        shared = {key: value for key, value in answer.items() if key != "result"}
        return [
            ItemAnswer({**shared, "result": result.get(str(index))}, index, size)
            for index in range(size)
        ]

    def _fall_back(self, size: int) -> list[Any]:
        self.fallbacks += 1
        self._alone_until = time.monotonic() + FALLBACK_SECONDS
        return [ASK_ALONE] * size
