"""`Witnessing`: each chain's newest checkpoint note submitted to the configured witnesses,
and their cosignatures kept (`store.chain.witness_store`).

A witness is sent the note when no cosignature of it that verifies on that note is
kept: `old` is the size it last cosigned (0 at first; never above the note's), with
the consistency proof from there (`store.chain.log_proofs`). A 409 names the size
the witness knows: at most the note's, the submission is made once more from that
size (so a restart that remembers nothing, or a lost line, converges); above it, the
witness knows a larger tree than ours. Each line a 200 answers is verified under the
witness's key (`store.chain.cosignature.verify_cosignature`) before it is kept.

A witness that refuses (a 4xx, a 409 above the note's size, a cosignature that does
not verify) is the log event `log_witness_refused` (its key name, the chain, the
status and why, never the body), `sessionstate_log_witness_refusals_total` and the
`/readyz` warning `log_witness_refused`, until it cosigns that chain again; the
same note is not sent to it again (a newer one is). A witness that does not answer
(connection, timeout, 5xx) is `log_witness_unreachable` and
`sessionstate_log_witness_unreachable_total`, and is asked again next round.
"""

from __future__ import annotations

import logging
import threading

import httpx

from service.config.log_witnesses import LogWitness, WitnessSet
from service.decisions.witness_client import (
    Answer,
    Conflict,
    Cosigned,
    Refused,
    Unreachable,
    add_checkpoint,
)
from service.observability.metrics import ServiceMetrics
from store.chain.cosignature import Cosignature, verify_cosignature
from store.chain.evidence import EvidenceChain
from store.chain.log_note import SignedTreeHead, TreeUnavailable
from store.chain.log_proofs import ProofPruned, consistency
from store.chain.note import NoteError
from store.chain.witness_store import keep_cosignature, with_cosignatures, witnessed_size

log = logging.getLogger("sessionstate.decisions")
REFUSED_WARNING = "log_witness_refused"


class Witnessing:
    """Submits notes to the witnesses of `witnesses`; remembers which refused (in memory)."""

    def __init__(self, witnesses: WitnessSet, metrics: ServiceMetrics) -> None:
        self.witnesses = witnesses
        self._metrics = metrics
        self._client = httpx.Client(follow_redirects=False)
        self._refused: dict[tuple[str, str], int] = {}  # (chain, witness): the size refused
        self._lock = threading.Lock()

    @property
    def refusing(self) -> bool:
        """Whether some witness refused the last note it was sent of some chain."""
        return bool(self._refused)

    def close(self) -> None:
        self._client.close()

    def submit(self, chain: EvidenceChain, signed: SignedTreeHead) -> None:
        """Send `signed` to each witness that has no cosignature of it kept yet."""
        if signed.head.size == 0:
            return  # an empty tree: nothing for a witness to check
        with self._lock:  # one submission of a chain's note at a time
            keys = [w.vkey for w in self.witnesses.witnesses]
            kept = set(with_cosignatures(chain.lanes, chain.name, signed, keys).cosigners)
            for witness in self.witnesses.witnesses:
                refused = self._refused.get((chain.name, witness.name))
                if witness.name not in kept and refused != signed.head.size:
                    self._submit_to(chain, signed, witness)

    def _submit_to(self, chain: EvidenceChain, signed: SignedTreeHead, witness: LogWitness) -> None:
        size = signed.head.size
        old = min(witnessed_size(chain.lanes, chain.name, witness.vkey), size)
        answer = self._post(chain, signed, witness, old)
        if isinstance(answer, Conflict) and answer.size <= size:
            answer = self._post(chain, signed, witness, answer.size)  # once, from its size
        if isinstance(answer, Conflict):
            self._refuse(chain, witness, size, 409, "size_not_ours")
        elif isinstance(answer, Refused):
            self._refuse(chain, witness, size, answer.status, "refused")
        elif isinstance(answer, Unreachable):
            self._metrics.log_witness_unreachable.labels(witness=witness.name).inc()
            extra = {"witness": witness.name, "chain": chain.name, "error_type": answer.error_type}
            log.warning("log_witness_unreachable", extra=extra)
        elif isinstance(answer, Cosigned):
            self._cosigned(chain, signed, witness, answer)

    def _post(
        self, chain: EvidenceChain, signed: SignedTreeHead, witness: LogWitness, old: int
    ) -> Answer | None:
        """One submission from `old`; None when the proof cannot be made (logged)."""
        size = signed.head.size
        try:
            proof = [] if old in (0, size) else consistency(chain, old, size, size).hashes
        except (ProofPruned, TreeUnavailable) as error:
            extra = {
                "witness": witness.name,
                "chain": chain.name,
                "error_type": type(error).__name__,
            }
            log.warning("log_witness_unprovable", extra=extra)
            return None
        return add_checkpoint(self._client, witness.add_checkpoint_url, old, proof, signed.note)

    def _cosigned(
        self, chain: EvidenceChain, signed: SignedTreeHead, witness: LogWitness, answer: Cosigned
    ) -> None:
        vkey = witness.vkey
        claimed = [s for s in answer.lines if (s.name, s.key_id) == (vkey.name, vkey.key_id)]
        verified: list[Cosignature] = []
        try:
            verified = [verify_cosignature(s, signed.head.text(), vkey) for s in claimed]
        except NoteError:
            verified = []
        if not verified:
            self._refuse(chain, witness, signed.head.size, 200, "cosignature_invalid")
            return
        keep_cosignature(chain.lanes, chain.name, signed.head.size, vkey, verified[0].line)
        self._refused.pop((chain.name, witness.name), None)
        self._metrics.log_witness_cosignatures.labels(witness=witness.name).inc()
        extra = {"witness": witness.name, "chain": chain.name, "tree_size": signed.head.size}
        log.info("log_witness_cosigned", extra=extra)

    def _refuse(
        self, chain: EvidenceChain, witness: LogWitness, size: int, status: int, why: str
    ) -> None:
        self._refused[(chain.name, witness.name)] = size
        self._metrics.log_witness_refusals.labels(witness=witness.name).inc()
        extra = {
            "witness": witness.name,
            "chain": chain.name,
            "tree_size": size,
            "status": status,
            "reason": why,
        }
        log.error(REFUSED_WARNING, extra=extra)
