"""The reviewer page's word on the tenant's Merkle tree: the latest checkpoint note's size,
whether the quorum of witnesses cosigned (as verify's `witnessed` says), and where the
note and its verifier key are served.

A page view signs no note: it shows the latest one kept (`store.chain.log_note`), which
the verify, the proof routes, bundles and the checkpoint job sign.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.api.v1 import DECISIONS_CHECKPOINT, DECISIONS_LOG_KEY
from service.api.wire import WitnessedHead
from service.http.common import context
from service.http.decision_proofs import log_signer
from service.http.decisions import witnessed_head
from store.chain.log_note import latest_note


@dataclass(frozen=True)
class LogHead:
    """The latest note's tree size (None: none signed yet) and the witnesses' word."""

    note_size: int | None
    witnessed: WitnessedHead | None
    checkpoint_url: str = DECISIONS_CHECKPOINT
    log_key_url: str = DECISIONS_LOG_KEY


def log_head(tenant: str) -> LogHead:
    latest = latest_note(context().lanes, log_signer(), tenant)
    return LogHead(None if latest is None else latest.head.size, witnessed_head(tenant))
