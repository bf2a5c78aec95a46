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

A cancel does not end every wait either: PgBouncer (1.18) drops a cancel request
for a client it has queued waiting for a server connection (`cancel request for
idle client`), as it does while the server behind it is down, and that client
then waits for `query_wait_timeout` (120 s by default). So a watch whose work has
not ended `SEVER_SECONDS` after its cancel shuts its connection's socket down (a
duplicate of it taken when the watch began, so never another connection's): the
work then fails as on a lost connection, and the caller closes it.

One daemon thread per store holds the deadlines of the connections being watched
and sends each overrun connection one cancel request (`cancel_safe`, itself
bounded). Ending a watch waits for a cancel or shutdown under way, so a connection
never goes back to its pool while a cancel for it may still arrive; the caller
closes a connection whose watch fired rather than reuse it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg

CANCEL_SECONDS = 2.0  # at most this long to deliver one cancel request
SEVER_SECONDS = 1.0  # work still running this long after its cancel: its socket is shut down


class Watch:
    """One connection's deadline; `fired` once a cancel was sent for it, `severed` once its
    socket was shut down because the cancel did not end the work."""

    def __init__(
        self,
        conn: psycopg.Connection[tuple[object, ...]],
        deadline: float,
        duplicate: socket.socket | None,
    ) -> None:
        self.conn = conn
        self.deadline = deadline
        self.duplicate = duplicate  # the connection's socket, duplicated: to shut it down
        self.fired = False
        self.severed = False
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
        self.severed = 0  # connections shut down because their cancel did not end the work

    @contextmanager
    def watch(
        self, conn: psycopg.Connection[tuple[object, ...]], seconds: float
    ) -> Iterator[Watch]:
        """Cancel what runs on conn once `seconds` have passed, and shut its socket down
        `SEVER_SECONDS` after that if it still runs, until the block ends."""
        watch = Watch(conn, time.monotonic() + seconds, _duplicate(conn))
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
                if watch.duplicate is not None:
                    watch.duplicate.close()

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
                if watch.fired:
                    self._sever(watch)
                elif self._cancel(watch):
                    with self._cond:  # shut down later if the cancel does not end the work
                        watch.deadline = time.monotonic() + SEVER_SECONDS
                        self._watches.add(watch)

    def _cancel(self, watch: Watch) -> bool:
        """Send watch's connection a cancel request; whether the work still ran."""
        with watch.lock:
            if watch.done:
                return False
            watch.fired = True
            self.fired += 1
            with suppress(psycopg.Error, OSError):  # the caller fails the work either way
                watch.conn.cancel_safe(timeout=CANCEL_SECONDS)
            return True

    def _sever(self, watch: Watch) -> None:
        """Shut down the socket of work a cancel did not end: it fails as on a lost connection."""
        with watch.lock:
            if watch.done or watch.duplicate is None:
                return
            watch.severed = True
            self.severed += 1
            with suppress(OSError):
                watch.duplicate.shutdown(socket.SHUT_RDWR)


def _duplicate(conn: psycopg.Connection[tuple[object, ...]]) -> socket.socket | None:
    """A duplicate of conn's socket (None when it has none): shutting it down ends the work on
    conn, and it stays this socket even once libpq has closed its own descriptor."""
    try:
        duplicate = os.dup(conn.fileno())
    except (psycopg.Error, OSError):
        return None
    try:
        return socket.socket(fileno=duplicate)
    except OSError:
        os.close(duplicate)
        return None
