"""The Merkle evidence an evidence bundle carries: the checkpoint note of the head its chain
verified to, each shipped entry's inclusion proof against it, and the keys to check them.

Beside the JSON checkpoint (`service.decisions.evidence_bundle`), a bundle ships

- `checkpoint.note`: the chain's C2SP tlog-checkpoint of that head (tree size = its
  seq), signed as a note by the data dir's checkpoint key (`store.chain.log_note`:
  the kept note of that size, else one signed now by the same rule the checkpoint
  route follows, never for a broken chain), with every configured witness's kept
  cosignature that verifies on it as further signature lines;
- `proofs.ndjson`: one inclusion proof a line, `{"leaf_index", "tree_size",
  "leaf_hash", "hashes"}` as `GET /v1/decisions/{decision_id}/inclusion` answers
  it, for each line of `entries.ndjson`, in the same order;
- `log-key.vkey`: the notes' verifier key (`sessionstate decisions log-key`);
- when the quorum of witnesses did not cosign that head (a head is cosigned after
  it is signed, and every read of the chain is a decision on it: a bundle's head is
  most often newer than the witnessed one), `witnessed.note`, the newest note the
  quorum cosigned (else the newest any witness did), and `consistency.json`, the
  proof that the bundle's tree extends it;
- when a time-stamping authority timestamped a note of the chain
  (`store.chain.timestamp_store`), `timestamp.tsr`: its RFC 3161 `TimeStampResp`, as
  it answered, over the signed text of the bundle's note when that note has one, else
  over the newest older timestamped note's, shipped as `timestamped.note` with
  `timestamp-consistency.json`, the proof that the bundle's tree extends it.

The manifest's `log` member states the origin, the tree size and root, the verifier
key, the witnesses' keys and quorum, the witnessed size and the timestamped size; for a chain without a tree
that holds (`TreeUnavailable`), only `absent` and the reason code, and no file.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import IO, Any

from service.api.reasons import Reason
from service.api.wire import ConsistencyProofResponse, InclusionProofResponse
from service.config.log_witnesses import WitnessSet
from store.chain.evidence import EvidenceChain
from store.chain.log_note import LogSigner, SignedTreeHead, TreeUnavailable, note_of, stored_note
from store.chain.log_proofs import ProofPruned, consistency, inclusion
from store.chain.signed_head import Verified
from store.chain.timestamp_store import newest_timestamped, timestamp_of
from store.chain.witness_store import CosignedNote, newest_cosigned, with_cosignatures

NOTE_FILE = "checkpoint.note"
PROOFS_FILE = "proofs.ndjson"
LOG_KEY_FILE = "log-key.vkey"
WITNESSED_NOTE_FILE = "witnessed.note"
CONSISTENCY_FILE = "consistency.json"
TIMESTAMP_FILE = "timestamp.tsr"
TIMESTAMPED_NOTE_FILE = "timestamped.note"
TIMESTAMP_CONSISTENCY_FILE = "timestamp-consistency.json"


@dataclass
class LogEvidence:
    """What a bundle says of the chain's tree: its files (but the proofs, streamed to
    `proofs`), and the manifest's `log` member; `absent` names why there is none."""

    files: dict[str, bytes] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
    absent: str | None = None
    chain: EvidenceChain | None = None
    size: int = 0

    @classmethod
    def without_tree(cls) -> LogEvidence:
        """A chain without a tree that holds: no note, no proof, and why."""
        return cls(absent=str(Reason.DECISION_LOG_TREE_UNAVAILABLE))

    def add_proof(self, sink: IO[bytes], seq: int, stored: bytes) -> None:
        """Write the inclusion proof of entry `seq` (its stored bytes) to `sink`; a tree that
        does not hold leaves the bundle without proofs (`absent`)."""
        if self.chain is None or self.absent is not None:
            return
        try:
            proof = inclusion(self.chain, seq, stored, self.size, self.size)
        except TreeUnavailable:
            self.absent, self.files, self.log = LogEvidence.without_tree().absent, {}, {}
            return
        sink.write(InclusionProofResponse.of(proof).model_dump_json().encode() + b"\n")

    def manifest_member(self) -> dict[str, Any]:
        return {"absent": self.absent} if self.absent is not None else self.log


def log_evidence(
    chain: EvidenceChain, verified: Verified, log: LogSigner, witnesses: WitnessSet
) -> LogEvidence:
    """The note of the head `verified` signed, its cosignatures, and what witnessed it."""
    assert verified.checkpoint is not None  # a broken chain has no bundle
    size = verified.checkpoint.seq
    try:
        signed = stored_note(chain.lanes, log, chain.name, size) or note_of(chain, verified, log)
    except TreeUnavailable:
        return LogEvidence.without_tree()
    keys = [witness.vkey for witness in witnesses.witnesses]
    head = with_cosignatures(chain.lanes, chain.name, signed, keys)
    evidence = LogEvidence(
        files={NOTE_FILE: head.note, LOG_KEY_FILE: f"{log.verifier_key}\n".encode()},
        log={
            "origin": signed.head.origin,
            "tree_size": size,
            "root_hash": base64.b64encode(signed.head.root_hash).decode(),
            "verifier_key": str(log.verifier_key),
            "witnesses": [str(key) for key in keys],
            "quorum": witnesses.quorum,
            "witnessed_size": size if head.cosigners else None,
            "timestamped_size": None,
        },
        chain=chain,
        size=size,
    )
    if witnesses and len(head.cosigners) < witnesses.quorum:
        _add_witnessed(evidence, chain, log, signed, witnesses)
    _add_timestamp(evidence, chain, log, signed)
    return evidence


def _add_witnessed(
    evidence: LogEvidence,
    chain: EvidenceChain,
    log: LogSigner,
    signed: SignedTreeHead,
    witnesses: WitnessSet,
) -> None:
    """The newest older note the quorum (else any witness) cosigned, and the consistency
    proof from it to the bundle's note."""
    keys = [witness.vkey for witness in witnesses.witnesses]
    found: CosignedNote | None = newest_cosigned(
        chain.lanes, log, chain.name, keys, witnesses.quorum
    ) or newest_cosigned(chain.lanes, log, chain.name, keys)
    size = signed.head.size
    if found is None or not 0 < found.signed.head.size < size:
        return
    first = found.signed.head.size
    try:
        proof = consistency(chain, first, size, size)
    except (ProofPruned, TreeUnavailable):
        return  # the witnessed tree is below what retention kept: no proof to ship
    evidence.files[WITNESSED_NOTE_FILE] = found.note
    evidence.files[CONSISTENCY_FILE] = (
        ConsistencyProofResponse.of(proof).model_dump_json().encode() + b"\n"
    )
    evidence.log["witnessed_size"] = first


def _add_timestamp(
    evidence: LogEvidence, chain: EvidenceChain, log: LogSigner, signed: SignedTreeHead
) -> None:
    """The kept timestamp of the bundle's note, else of the newest older timestamped note
    with that note and the consistency proof from it."""
    size = signed.head.size
    reply = timestamp_of(chain.lanes, chain.name, signed)
    if reply is not None:
        evidence.files[TIMESTAMP_FILE] = reply
        evidence.log["timestamped_size"] = size
        return
    found = newest_timestamped(chain.lanes, log, chain.name, (), 0)
    if found is None or not 0 < found.signed.head.size < size:
        return
    first = found.signed.head.size
    older = timestamp_of(chain.lanes, chain.name, found.signed)
    try:
        proof = consistency(chain, first, size, size)
    except (ProofPruned, TreeUnavailable):
        return  # the timestamped tree is below what retention kept: no proof to ship
    assert older is not None  # newest_timestamped found it covering that note
    evidence.files[TIMESTAMP_FILE] = older
    evidence.files[TIMESTAMPED_NOTE_FILE] = found.note
    evidence.files[TIMESTAMP_CONSISTENCY_FILE] = (
        ConsistencyProofResponse.of(proof).model_dump_json().encode() + b"\n"
    )
    evidence.log["timestamped_size"] = first
