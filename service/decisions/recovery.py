"""`StoreRecovery`: the journal's store reopened after a failed write latched it.

A store that failed a write refuses writes until it is reopened (`Lanes.reopen`).
A commit that finds it latched reopens it first; so that a store latched while
no request comes is not left so, a thread of its own tries too, at most once
every `RECOVERY_INTERVAL_SECONDS`. A reopen takes `lock`, which a commit that
must never run beside one (LevelDB's reopen closes the database) holds too.
After a reopen what the journal remembered of the store is forgotten
(`forget`): a write of unknown outcome may have landed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from store.backends.contract import Lanes, recovers

log = logging.getLogger("sessionstate.journal")
RECOVERY_INTERVAL_SECONDS = 1.0


class StoreRecovery:
    """Reopens a latched store: when a commit asks (`writable`), and now and then while idle."""

    def __init__(
        self,
        lanes: Lanes,
        forget: Callable[[], None],
        on_reopened: Callable[[Lanes], None] | None = None,
    ) -> None:
        self._lanes = lanes
        self._forget = forget
        self._on_reopened = on_reopened
        self._last_attempt = 0.0
        self.lock = threading.RLock()  # held by a reopen, and by commits it must not overlap
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._while_idle, name="decision-journal-recovery", daemon=True
        )
        self._thread.start()

    def writable(self) -> bool:
        """Reopen a latched store when there is room; at most once a second. True if writable."""
        if self._lanes.writable:
            return True
        with self.lock:
            return self._lanes.writable or self._reopen()

    def close(self, timeout: float) -> None:
        """Stop trying; wait at most timeout for the thread to end."""
        self._closed.set()
        self._thread.join(max(0.0, timeout))

    def _while_idle(self) -> None:
        while not self._closed.wait(RECOVERY_INTERVAL_SECONDS):
            self.writable()

    def _reopen(self) -> bool:
        """Reopen the latched store (under `lock`), then forget what was known of it."""
        now = time.monotonic()
        lanes = self._lanes
        if (
            not recovers(lanes)
            or now - self._last_attempt < RECOVERY_INTERVAL_SECONDS
            or not lanes.room_to_reopen()
        ):
            return False
        self._last_attempt = now
        try:
            lanes.reopen()
            self._forget()
        except Exception as error:  # still no room, or worse: stay latched, try again later
            log.error("store_reopen_failed", extra={"error_type": type(error).__name__})
            return False
        log.warning("store_reopened")
        if self._on_reopened is not None:
            self._on_reopened(self._lanes)
        return True
