"""`DecisionScrub`: the service walks every tenant's chain whole on its own, as storage
systems scrub their disks.

A verify resumes from the last signed head, so nothing re-reads old entries
unless someone asks for `full=true`. The scrub does: every
`SESSIONSTATE_DECISION_SCRUB_SECONDS`, each chain whose last whole walk
(`store.chain.full_walk`, by the scrub or by a verify) is older than that, or that
has a pass under way, is walked from its anchor to its head
(`store.chain.scrub_pass`), a few hundred entries at a time with a pause after each
part (longer than the part took), so requests keep the store and the CPU. A
restart goes on where the pass stopped.

A pass that finds a problem is logged (`decision_scrub_failed`, with the
chain, the problem and the seq), counted
(`sessionstate_decision_scrub_failures_total`, as is a scrub that could not
read the store), and shown in `/readyz` (warning `decision_scrub_failed`)
while some chain's last whole walk says it does not hold. A round in which
every chain it walked held sets `sessionstate_decision_scrub_last_success_timestamp_seconds`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from service.observability.metrics import ServiceMetrics
from store.backends.contract import Lanes
from store.chain.checkpoints import CheckpointSigner
from store.chain.evidence import EvidenceChain
from store.chain.full_walk import FullWalk, last_full_walk
from store.chain.head import parse_timestamp
from store.chain.keys import chain_names
from store.chain.scrub_pass import scrub_in_progress, scrub_step
from store.secrets import SecretsHome

log = logging.getLogger("sessionstate.decisions")
SCRUB_BATCH = 256  # stored keys walked per part
MIN_PAUSE_SECONDS = 0.01
PAUSE_FACTOR = 3.0  # a pause this many times as long as the part took: a quarter of one core


class DecisionScrub:
    """A background thread: a round at start, then as chains fall due, until closed."""

    def __init__(
        self,
        lanes: Lanes,
        secrets: SecretsHome,
        *,
        interval: float,
        clock: Callable[[], datetime],
        metrics: ServiceMetrics,
        batch: int = SCRUB_BATCH,
    ) -> None:
        self._lanes = lanes
        self._secrets = secrets
        self._interval = timedelta(seconds=interval)
        self._clock = clock
        self._metrics = metrics
        self._batch = batch
        self._broken: set[str] = set()  # chains whose last whole walk does not hold
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="decision-scrub", daemon=True)
        self._thread.start()

    @property
    def failing(self) -> bool:
        """Whether some chain's last whole walk (the scrub's, or a verify's) found a problem."""
        return bool(self._broken)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            wait = self._interval
            try:
                wait = self.round()
            except Exception as error:  # the scrub must never take the service down
                self._metrics.decision_scrub_failures.inc()
                log.error("decision_scrub_failed", extra={"error_type": type(error).__name__})
            if self._stop.wait(wait.total_seconds()):
                return

    def round(self) -> timedelta:
        """Walk every chain that is due; how long until the next one is."""
        names = chain_names(self._lanes)
        if not names:
            return self._interval
        signer = CheckpointSigner.of(self._secrets)
        due, next_due = [], self._interval
        for name in names:
            chain = EvidenceChain(self._lanes, name)
            last = last_full_walk(chain, signer.verifier())
            self.note(name, last)
            ended = None if last is None else parse_timestamp(last.at)
            wait = self._interval if ended is None else ended + self._interval - self._clock()
            if last is None or wait <= timedelta(0) or scrub_in_progress(chain, signer):
                due.append(chain)
            else:
                next_due = min(next_due, wait)
        held = True
        for chain in due:
            walk = self._walk(chain, signer)
            if walk is None:  # closing
                return self._interval
            held = held and walk.ok
        if due and held:
            self._metrics.decision_scrub_last_success.set(self._clock().timestamp())
        return next_due

    def _walk(self, chain: EvidenceChain, signer: CheckpointSigner) -> FullWalk | None:
        """One pass over the chain, part by part with a pause after each; None when closing."""
        while not self._stop.is_set():
            started = time.monotonic()
            walk = scrub_step(chain, signer, self._clock(), self._batch)
            if walk is not None:
                self.note(chain.name, walk)
                if not walk.ok:
                    self._metrics.decision_scrub_failures.inc()
                    log.error(
                        "decision_scrub_failed",
                        extra={
                            "chain": chain.name,
                            "problem": walk.problem,
                            "seq": walk.first_invalid_seq,
                        },
                    )
                return walk
            pause = max(MIN_PAUSE_SECONDS, PAUSE_FACTOR * (time.monotonic() - started))
            if self._stop.wait(pause):
                break
        return None

    def note(self, name: str, walk: FullWalk | None) -> None:
        """The chain's last whole walk, the scrub's or a verify's: whether /readyz warns."""
        if walk is not None and not walk.ok:
            self._broken.add(name)
        else:
            self._broken.discard(name)
