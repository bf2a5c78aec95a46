"""`Deadlines`: work on a PostgreSQL connection bounded from the client, by cancelling it.

`statement_timeout` bounds a statement on the server, but not every wait: a COMMIT
waiting for a synchronous standby (`SyncRep`, when `synchronous_standby_names`
names standbys that are not connected) ignores it and waits for as long as the
standby is away. A cancel request ends that wait, and the COMMIT then answers
with a WARNING, not an error: the transaction committed locally, and may not have
reached any standby. So the caller must treat work that a watch cancelled as of
unknown outcome when it included a COMMIT (`Watch.fired`), whatever it answered.

Behind a transaction pooler that drops or refuses the `options` startup parameter
(PgBouncer), statements have no `statement_timeout` of the store's: the same watch
bounds them.

One daemon thread per store holds the deadlines of the connections being watched
and sends each overrun connection one cancel request (`cancel_safe`, itself
bounded). Ending a watch waits for a cancel under way, so a connection never goes
back to its pool while a cancel for it may still arrive; the caller closes a
connection whose watch fired rather than reuse it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg

CANCEL_SECONDS = 2.0  # at most this long to deliver one cancel request


class Watch:
    """One connection's deadline; `fired` once a cancel was sent for it."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]], deadline: float) -> None:
        self.conn = conn
        self.deadline = deadline
        self.fired = False
        self.done = False
        self.lock = threading.Lock()  # held while cancelling, and while ending the watch


class Deadlines:
    """Cancels watched connections whose deadline passed (one thread, started on first use)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._watches: set[Watch] = set()
        self._wake_at: float | None = None  # when the thread wakes next (None: when told)
        self._thread: threading.Thread | None = None
        self._pid = 0  # the process that started the thread (a fork has none of its own)
        self._closed = False
        self.fired = 0  # cancels sent so far

    @contextmanager
    def watch(
        self, conn: psycopg.Connection[tuple[object, ...]], seconds: float
    ) -> Iterator[Watch]:
        """Cancel what runs on conn once `seconds` have passed, until the block ends."""
        watch = Watch(conn, time.monotonic() + seconds)
        with self._cond:
            if (self._thread is None or self._pid != os.getpid()) and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name=f"{self._name}-deadlines", daemon=True
                )
                self._pid = os.getpid()
                self._thread.start()
            self._watches.add(watch)
            if self._wake_at is None or watch.deadline < self._wake_at:
                self._cond.notify()
        try:
            yield watch
        finally:
            with self._cond:
                self._watches.discard(watch)
            with watch.lock:  # a cancel under way ends first
                watch.done = True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                due = {watch for watch in self._watches if watch.deadline <= now}
                self._watches -= due
                if not due:
                    self._wake_at = min((w.deadline for w in self._watches), default=None)
                    self._cond.wait(None if self._wake_at is None else self._wake_at - now)
                    continue
            for watch in due:
                self._cancel(watch)

    def _cancel(self, watch: Watch) -> None:
        with watch.lock:
            if watch.done:
                return
            watch.fired = True
            self.fired += 1
            with suppress(psycopg.Error, OSError):  # the caller fails the work either way
                watch.conn.cancel_safe(timeout=CANCEL_SECONDS)
