"""`Timestamping`: each chain's newest checkpoint note timestamped by the RFC 3161
time-stamping authority of `SESSIONSTATE_TSA_URL`, and the reply kept
(`store.chain.timestamp_store`).

The background job (`service.decisions.log_checkpoints`) hands it each chain's newest
note every round; a note whose kept reply covers it is not asked for again. A reply
that checks (`service.decisions.tsa_client`) is kept beside the note, the log event
`log_timestamp_kept` and `sessionstate_log_timestamps_total`. A TSA that cannot be
reached (connection, timeout, 5xx: `unreachable`), that says no (a 4xx or a status
other than granted: `refused`), or whose reply does not timestamp the note (unreadable,
another digest or nonce, a signature that does not verify: `invalid`) is the log event
`log_timestamp_failed` (the chain, the size, the reason and which check, never the
body) and `sessionstate_log_timestamp_failures_total{reason}`; nothing is kept, and the
note is asked for again next round while it is the newest. No request waits on it.
"""

from __future__ import annotations

import logging

import httpx

from service.config.timestamp_authority import TimestampAuthority
from service.decisions.tsa_client import Stamped, Unreachable, request_timestamp
from service.observability.metrics import ServiceMetrics
from store.chain.evidence import EvidenceChain
from store.chain.log_note import SignedTreeHead
from store.chain.timestamp_store import keep_timestamp, timestamp_of

log = logging.getLogger("sessionstate.decisions")
_REFUSALS = ("not_granted",)  # the TSA's own no; the other checks mean an invalid reply


class Timestamping:
    """Asks the TSA for the timestamps of the notes it is handed, on the caller's thread."""

    def __init__(self, authority: TimestampAuthority, metrics: ServiceMetrics) -> None:
        self.authority = authority
        self._metrics = metrics
        self._client = httpx.Client(follow_redirects=False)

    def close(self) -> None:
        self._client.close()

    def stamp(self, chain: EvidenceChain, signed: SignedTreeHead) -> None:
        """Timestamp `signed` unless a kept reply covers it already."""
        if signed.head.size == 0 or timestamp_of(chain.lanes, chain.name, signed) is not None:
            return
        size = signed.head.size
        answer = request_timestamp(self._client, self.authority, signed.head.text().encode())
        extra: dict[str, object] = {"chain": chain.name, "tree_size": size}
        if isinstance(answer, Stamped):
            keep_timestamp(chain.lanes, chain.name, size, answer.reply)
            self._metrics.log_timestamps.inc()
            log.info("log_timestamp_kept", extra=extra)
            return
        if isinstance(answer, Unreachable):
            reason, why = "unreachable", answer.error_type
        else:
            refused = answer.why.startswith("http_") or answer.why in _REFUSALS
            reason, why = ("refused" if refused else "invalid"), answer.why
        self._metrics.log_timestamp_failures.labels(reason=reason).inc()
        log.warning("log_timestamp_failed", extra={**extra, "reason": reason, "why": why})
