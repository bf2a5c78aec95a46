"""`PeriodicPrune`: a background thread that prunes once at start (or after a first
interval), then every `interval` seconds, until closed; `wake` runs the next pass now.
A failed prune is logged and tried again next time: pruning must never take the
service down. The same loop runs other background jobs (the decision log's
checkpoint notes), which name their own outcome events."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable


class PeriodicPrune:
    def __init__(
        self,
        prune: Callable[[], int],
        *,
        interval: float,
        name: str,
        log: logging.Logger,
        event: str,
        outcomes: tuple[str, str] = ("pruned", "prune_failed"),
        run_at_start: bool = True,
    ) -> None:
        """`prune` returns how many it pruned; logged as `<event>_pruned` (when any) and
        `<event>_prune_failed` (`outcomes` names those two suffixes)."""
        self._prune = prune
        self._interval = interval
        self._log = log
        self._event = event
        self._outcomes = outcomes
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._run_at_start = run_at_start
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the next pass now (or as soon as the one under way ends)."""
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)

    def _run(self) -> None:
        if not self._run_at_start and self._waited():
            return
        while True:
            done, failed = self._outcomes
            try:
                pruned = self._prune()
                if pruned:
                    self._log.info(f"{self._event}_{done}", extra={done: pruned})
            except Exception as error:  # pruning must never take the service down
                self._log.error(
                    f"{self._event}_{failed}", extra={"error_type": type(error).__name__}
                )
            if self._waited():
                return

    def _waited(self) -> bool:
        """Wait for the interval or a wake; whether the loop is closing."""
        self._wake.wait(self._interval)
        self._wake.clear()
        return self._stop.is_set()
