"""`GroupCommits`: one group commit per line (a decision chain), each with a leader of its own.

Requests queue their entry on its line and one of them commits: the leader. A
request that finds its line without a leader becomes it and commits its own
entry at once, in its own thread (no hop to another thread and back); requests
that arrive on that line while a batch of it is being committed queue behind
it, and when that commit is done the leader hands the lead to the oldest of
them, which commits all that queued meanwhile (up to `max_batch`), and so on
until the line's queue is empty; then the line is forgotten. So requests of
one line share one commit, and each line's batches are committed one at a
time, in order.

Lines do not wait for each other: a batch that cannot commit now (its chain's
rows locked by another transaction, a slow statement, a lost race) holds only
its own line's requests, while other lines' leaders commit beside it. At most
`concurrent` leaders commit at once (a store's connections are few); a leader
waits for a free turn, which it gets when another line's commit ends.

What a commit does, and how each item is settled, is the caller's
(`DecisionJournal`): an item the commit left unsettled is handed to `abandon`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    """An item on a line: woken when it is settled, or when the lead is handed to it."""

    @property
    def wake(self) -> threading.Event: ...

    @property
    def settled(self) -> bool: ...


T = TypeVar("T", bound=Queued)


class GroupCommitsClosed(RuntimeError):
    """No more items are taken: nothing of this one was queued."""


@dataclass
class _Line(Generic[T]):
    waiting: deque[T] = field(default_factory=deque)  # items not taken into a batch yet


class GroupCommits(Generic[T]):
    """Group commit on separate lines, each led by one of its own requests at a time."""

    def __init__(
        self,
        commit: Callable[[list[T]], None],
        abandon: Callable[[list[T]], None],
        *,
        max_batch: int,
        concurrent: int,
    ) -> None:
        self._commit = commit
        self._abandon = abandon
        self._max_batch = max_batch
        self._turns = threading.BoundedSemaphore(max(1, concurrent))
        self._lines: dict[str, _Line[T]] = {}  # the lines with a leader; no other line is kept
        self._guard = threading.Lock()
        self._idle = threading.Condition(self._guard)  # notified when a line loses its leader
        self._closed = False

    def submit(self, line: str, item: T) -> None:
        """Queue item on line; return once it is settled (committed or failed)."""
        with self._guard:
            if self._closed:
                raise GroupCommitsClosed("no more items are taken")
            queue = self._lines.get(line)
            leads = queue is None
            if queue is None:
                queue = self._lines[line] = _Line()
            queue.waiting.append(item)
        if not leads:  # wait until a leader commits the item, or hands it the lead
            item.wake.wait()
        if not item.settled:
            self._lead(line, queue)

    def close(self, timeout: float) -> bool:
        """Take no more items; wait (at most timeout) for every line's queued ones. True if
        every line is done."""
        with self._idle:
            self._closed = True
            return self._idle.wait_for(lambda: not self._lines, timeout)

    def _lead(self, line: str, queue: _Line[T]) -> None:
        """Commit what queued on line (the leader's item first: a leader is the oldest queued),
        then hand the lead to the oldest that queued meanwhile, or let the line go."""
        with self._guard:
            count = min(self._max_batch, len(queue.waiting))
            batch = [queue.waiting.popleft() for _ in range(count)]
        try:
            with self._turns:
                self._commit(batch)
        finally:
            self._abandon([item for item in batch if not item.settled])
            with self._guard:
                if queue.waiting:
                    queue.waiting[0].wake.set()  # the lead passes; it is not settled yet
                else:
                    del self._lines[line]
                    self._idle.notify_all()
