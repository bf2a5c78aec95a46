"""`LogCheckpoints`: the decision log's checkpoint notes made on a clock, and witnessed.

Every `SESSIONSTATE_LOG_CHECKPOINT_SECONDS` (the first round one interval after
start), each tenant's chain that grew since its latest note gets one, signed by the
path `GET /v1/decisions/checkpoint` takes (`store.chain.log_note.current_note`: only
after the walk from the remembered signed head held, the tree checked). A chain that
does not verify, or whose tree does not hold, gets none: the log event
`log_checkpoint_unverified` or `log_checkpoint_tree_unavailable` and
`sessionstate_log_checkpoint_failures_total{reason}`, once per head (the same head
is not tried again; a new entry or a recorded loss is). Then, where witnesses are
configured, each chain's newest note goes to the witnesses that have not cosigned it
(`service.decisions.witnessing`), and, where `SESSIONSTATE_TSA_URL` is set, is
timestamped by that RFC 3161 authority unless a kept reply covers it
(`service.decisions.timestamping`). `wake` runs a round now: the routes do after they
answer, so a note they signed is submitted and timestamped in the background, never on
the request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from service.decisions.timestamping import Timestamping
from service.decisions.witnessing import Witnessing
from service.observability.metrics import ServiceMetrics
from service.runtime.periodic import PeriodicPrune
from store.backends.contract import Lanes
from store.chain.entry import ChainCorrupt
from store.chain.evidence import EvidenceChain
from store.chain.keys import tenant_chain_names
from store.chain.log_note import (
    LogSigner,
    SignedTreeHead,
    TreeUnavailable,
    current_note,
    latest_note,
)
from store.chain.signed_head import ChainUnverified
from store.secrets import SecretsHome

log = logging.getLogger("sessionstate.decisions")
_EVENTS = {"chain_unverified": "unverified", "tree_unavailable": "tree_unavailable"}


class LogCheckpoints(PeriodicPrune):
    """The background job: a round every `interval` seconds (or when woken), until closed."""

    def __init__(
        self,
        lanes: Lanes,
        secrets: SecretsHome,
        origin: str | None,
        witnessing: Witnessing | None,
        *,
        timestamping: Timestamping | None = None,
        interval: float,
        clock: Callable[[], datetime],
        metrics: ServiceMetrics,
    ) -> None:
        self._lanes = lanes
        self._secrets = secrets
        self._origin = origin
        self._signer: LogSigner | None = None  # made when a chain first needs it (the key)
        self.witnessing = witnessing
        self.timestamping = timestamping
        self._clock = clock
        self._metrics = metrics
        self._failed: dict[str, int] = {}  # chain: the head seq no note could be signed for
        super().__init__(
            self.round,
            interval=interval,
            name="log-checkpoints",
            log=log,
            event="log_checkpoint",
            outcomes=("signed", "round_failed"),
            run_at_start=False,
        )

    def close(self) -> None:
        super().close()
        if self.witnessing is not None:
            self.witnessing.close()
        if self.timestamping is not None:
            self.timestamping.close()

    def signer(self) -> LogSigner:
        """The notes' signer: the data dir's checkpoint key under the origin."""
        if self._signer is None:
            self._signer = LogSigner.of(self._secrets, self._origin)
        return self._signer

    def round(self) -> int:
        """Sign each grown chain's note, submit and timestamp the newest notes; how many were
        signed."""
        signed = 0
        for name in tenant_chain_names(self._lanes):
            chain = EvidenceChain(self._lanes, name)
            note, new = self._note(chain)
            signed += new
            if note is not None and self.witnessing is not None:
                self.witnessing.submit(chain, note)
            if note is not None and self.timestamping is not None:
                self.timestamping.stamp(chain, note)
        return signed

    def _note(self, chain: EvidenceChain) -> tuple[SignedTreeHead | None, bool]:
        """The chain's newest note, signed now when the chain grew since; whether it was."""
        try:
            seq = chain.head().seq
        except ChainCorrupt:
            seq = -1  # the walk names the problem
        if seq == 0:
            return None, False
        signer = self.signer()
        latest = latest_note(self._lanes, signer, chain.name)
        if latest is not None and latest.head.size == seq:
            return latest, False
        if self._failed.get(chain.name) == seq:
            return latest, False
        try:
            note = current_note(chain, self._secrets, signer, self._clock())
        except ChainUnverified as error:
            self._failure(chain, seq, "chain_unverified", problem=error.problem, seq=error.seq)
            return None, False
        except TreeUnavailable:
            self._failure(chain, seq, "tree_unavailable")
            return None, False
        self._failed.pop(chain.name, None)
        return note, latest is None or latest.head.size != note.head.size

    def _failure(self, chain: EvidenceChain, head: int, reason: str, **extra: object) -> None:
        self._failed[chain.name] = head
        self._metrics.log_checkpoint_failures.labels(reason=reason).inc()
        log.error(f"log_checkpoint_{_EVENTS[reason]}", extra={"chain": chain.name, **extra})
