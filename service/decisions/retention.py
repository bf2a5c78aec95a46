"""`RetentionTask`: the decision log pruned by age, on a thread of its own.

Once at start, then every `interval` seconds, it deletes the entries of every
chain recorded more than the retention days ago, and their index keys
(`service.decisions.log.prune_log`); each chain's anchor is signed with the
data dir's checkpoint key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from service.decisions.log import prune_log
from service.runtime.periodic import PeriodicPrune
from store.backends.contract import Lanes
from store.chain.checkpoints import CheckpointSigner
from store.secrets import SecretsHome

log = logging.getLogger("sessionstate.journal")


class RetentionTask(PeriodicPrune):
    """Prunes the decision log by age: once at start, then every `interval` seconds."""

    def __init__(
        self,
        lanes: Lanes,
        days: int,
        *,
        secrets: SecretsHome,
        clock: Callable[[], datetime],
        interval: float = 3600.0,
    ) -> None:
        self._lanes = lanes
        self._secrets = secrets  # its checkpoint key signs the anchors
        self._age = timedelta(days=days)
        self._clock = clock
        super().__init__(
            self.prune_now,
            interval=interval,
            name="decision-retention",
            log=log,
            event="decision_log",
        )

    def prune_now(self) -> int:
        now = self._clock()
        signer = CheckpointSigner.of(self._secrets)
        return prune_log(self._lanes, now - self._age, signer, now)
