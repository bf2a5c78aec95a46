"""`PeriodicPrune`: a background thread that prunes once at start, then every `interval`
seconds, until closed. A failed prune is logged and tried again next time: pruning
must never take the service down."""

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
    ) -> None:
        """`prune` returns how many it pruned; logged as `<event>_pruned` (when any) and
        `<event>_prune_failed`."""
        self._prune = prune
        self._interval = interval
        self._log = log
        self._event = event
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            try:
                pruned = self._prune()
                if pruned:
                    self._log.info(f"{self._event}_pruned", extra={"pruned": pruned})
            except Exception as error:  # pruning must never take the service down
                self._log.error(
                    f"{self._event}_prune_failed", extra={"error_type": type(error).__name__}
                )
            if self._stop.wait(self._interval):
                return
