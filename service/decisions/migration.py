"""`sessionstate db upgrade`: move the one global chain of older versions onto per-tenant chains.

Older versions kept every tenant's decisions on one chain (the chain named
`LEGACY_CHAIN`). The upgrade first verifies that chain whole and refuses if it
does not verify (`LegacyChainUnverified`, nothing changed). Then, in one
synced batch, it seals each entry again, in the old order, onto its tenant's
chain (`chain_name(target.tenant_id)`), with a `legacy` field holding where it
was on the old chain (`seq`, `prev_hash`, `hash`); deletes the old entries,
anchor and index keys; and writes a migration record (the old head and anchor,
how many entries moved, each new chain's head). So the old history stays
checkable: every old entry can be rebuilt from its migrated one (its fields
without `seq`, `prev_hash`, `hash` and `legacy`, plus the three of `legacy`)
and must hash to its old hash, and a checkpoint signed before the upgrade
(it names no tenant) is checked against those rebuilt entries
(`verify_legacy_checkpoint`). The service refuses to start on a data dir that
still holds the old chain (`journal.LegacyChainPresent`).

The upgrade also signs the retention anchors older releases stored unsigned
(`sign_unsigned_anchors`), each only after its chain verified from it; until
then a verify of that chain fails `anchor_unsigned`. Such an anchor's origin
is `db_upgrade`: it vouches that the chain from it was intact at the upgrade,
not that retention removed what went before.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.decisions.log import decision_id_key, seq_name
from store.backends.contract import Lanes
from store.canonical import canonical_digest, canonical_json
from store.chain.append import ChainExtension
from store.chain.checkpoints import Checkpoint, CheckpointSigner, CheckpointVerifier
from store.chain.entry import CHAIN_FIELDS, parse_entry
from store.chain.evidence import EvidenceChain
from store.chain.head import ChainHead, format_timestamp
from store.chain.keys import (
    LEGACY_CHAIN,
    anchor_key,
    chain_name,
    chain_names,
    entry_key,
    legacy_chain_present,
)
from store.chain.walk import ChainVerification
from store.key_codec import LaneKey, TenantResourceLane
from store.secrets import SecretsHome

MIGRATION_KEY = LaneKey(TenantResourceLane.TRACE_META, LEGACY_CHAIN, name=b"chain_migration")


class LegacyChainUnverified(RuntimeError):
    """The old chain does not verify: it is not migrated (nothing changed)."""

    def __init__(self, result: ChainVerification) -> None:
        where = f" at seq {result.first_invalid_seq}" if result.first_invalid_seq else ""
        super().__init__(
            f"the old decision chain does not verify ({result.problem}{where}); nothing was "
            "migrated: restore the data dir from a backup, or keep it as evidence as it is"
        )


class ChainMigration(BaseModel):
    """What `sessionstate db upgrade` did to the decision log; kept in the store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    migrated_at: str
    old_head: ChainHead = Field(description="the old global chain's head, as verified")
    old_anchor: ChainHead = Field(description="where retention had left its start")
    entries: int = Field(ge=0, description="entries moved onto per-tenant chains")
    chains: dict[str, ChainHead] = Field(description="each chain's head after the move")


def migrate(lanes: Lanes, now: datetime) -> ChainMigration | None:
    """Move the legacy chain onto per-tenant chains in one batch; None when there is none."""
    if not legacy_chain_present(lanes):
        return None
    legacy = EvidenceChain(lanes, LEGACY_CHAIN)
    verified = legacy.verify()
    if not verified.ok:
        raise LegacyChainUnverified(verified)
    extensions: dict[str, ChainExtension] = {}
    moved = 0
    with lanes.batch(sync=True) as batch:
        for seq, stored in legacy.stored_entries(until_seq=verified.head_seq):
            entry = parse_entry(stored) or {}
            body = {name: value for name, value in entry.items() if name not in CHAIN_FIELDS}
            body["legacy"] = {name: entry[name] for name in CHAIN_FIELDS}
            name = chain_name(_tenant_of(entry))
            if name not in extensions:
                extensions[name] = EvidenceChain(lanes, name).extension()
            (sealed,) = extensions[name].seal([body])
            decision_id = _member(entry, "decision").get("decision_id")
            if isinstance(decision_id, str):
                batch.put(decision_id_key(name, decision_id), seq_name(sealed.seq))
            batch.delete(entry_key(seq, LEGACY_CHAIN))
            moved += 1
        for extension in extensions.values():
            extension.add_to(batch)
        for key, _ in lanes.scan(TenantResourceLane.TRACE_INDEX):
            if key.tenant == LEGACY_CHAIN or not key.name.startswith(b"id:"):
                batch.delete(key)  # the old indexes: by decision id (no tenant), by tenant and seq
        batch.delete(anchor_key(LEGACY_CHAIN))
        record = ChainMigration(
            migrated_at=format_timestamp(now),
            old_head=ChainHead(seq=verified.head_seq, hash=verified.head_hash),
            old_anchor=legacy.anchor(),
            entries=moved,
            chains={name: extension.head for name, extension in extensions.items()},
        )
        batch.put(MIGRATION_KEY, canonical_json(record.model_dump(mode="json")))
    return record


def sign_unsigned_anchors(
    lanes: Lanes, secrets: SecretsHome, now: datetime
) -> dict[str, ChainVerification]:
    """Sign every chain's unsigned anchor with the data dir's checkpoint key (created if
    need be), each once the chain from it verified; by chain, the walk of each chain that
    had one (the anchor of one that did not verify stays unsigned)."""
    anchored = [name for name in chain_names(lanes) if lanes.get(anchor_key(name)) is not None]
    if not anchored:
        return {}
    signer = CheckpointSigner.of(secrets)
    walks = {
        name: EvidenceChain(lanes, name).sign_unsigned_anchor(signer, now) for name in anchored
    }
    return {name: walk for name, walk in walks.items() if walk is not None}


def migration_record(lanes: Lanes) -> ChainMigration | None:
    stored = lanes.get(MIGRATION_KEY)
    return None if stored is None else ChainMigration.model_validate_json(stored)


def verify_legacy_checkpoint(
    lanes: Lanes, checkpoint: Checkpoint, verifier: CheckpointVerifier
) -> ChainVerification:
    """Check a checkpoint signed before the upgrade (it names no tenant) against the old
    entries rebuilt from the migrated ones; ok only if the one at its seq hashes to its hash."""

    def outcome(problem: Any = None, seq: int | None = None) -> ChainVerification:
        return ChainVerification(
            ok=problem is None,
            entries=0,
            head_hash=checkpoint.head_hash,
            head_seq=checkpoint.seq,
            first_invalid_seq=seq,
            problem=problem,
        )

    if not verifier.verify(checkpoint):
        return outcome("checkpoint_signature_invalid")
    if checkpoint.tenant_id is not None:
        return outcome("checkpoint_other_chain")
    record = migration_record(lanes)
    if record is None:
        return outcome("checkpoint_other_chain")
    if checkpoint.seq > record.old_head.seq:
        return outcome("truncated_before_checkpoint", record.old_head.seq + 1)
    if checkpoint.seq == record.old_anchor.seq:
        ok = checkpoint.head_hash == record.old_anchor.hash
        return outcome(None if ok else "checkpoint_mismatch", checkpoint.seq if not ok else None)
    if checkpoint.seq < record.old_anchor.seq:
        return outcome("checkpoint_before_anchor")
    for name in chain_names(lanes):
        for entry in EvidenceChain(lanes, name).scan():
            link = _member(entry, "legacy")
            if link.get("seq") != checkpoint.seq:
                continue
            if (
                old_entry_hash(entry) != link.get("hash")
                or link.get("hash") != checkpoint.head_hash
            ):
                return outcome("checkpoint_mismatch", checkpoint.seq)
            return outcome()
    return outcome("truncated_before_checkpoint", checkpoint.seq)


def old_entry_hash(entry: Mapping[str, Any]) -> str | None:
    """The hash the entry had on the old chain, recomputed from its content; None if it has
    no legacy link or no canonical form."""
    link = _member(entry, "legacy")
    old = {name: value for name, value in entry.items() if name not in (*CHAIN_FIELDS, "legacy")}
    old["seq"], old["prev_hash"] = link.get("seq"), link.get("prev_hash")
    try:
        return canonical_digest(old)
    except Exception:  # no canonical form: the message may quote the content
        return None


def _tenant_of(entry: Mapping[str, Any]) -> str | None:
    tenant = _member(entry, "target").get("tenant_id")
    return tenant if isinstance(tenant, str) and tenant else None


def _member(entry: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = entry.get(name)
    return value if isinstance(value, dict) else {}
