"""Record validation blockers: why a record may not be written or trusted."""

from __future__ import annotations

from store.record.blockers import Blocker
from store.record.state_record import (
    GENESIS_DIGEST,
    RECORD_SCHEMA,
    RECORD_SCHEMA_V1,
    RECORD_SCHEMAS,
    SessionStateRecord,
)


def record_blockers(record: SessionStateRecord) -> list[Blocker]:
    """Every blocker of a record, sorted; empty when it may be written."""
    blockers: set[Blocker] = set()
    if record.schema_ not in RECORD_SCHEMAS:
        blockers.add(Blocker.SCHEMA_MISMATCH)
    if not record.memory_anchors:
        blockers.add(Blocker.MEMORY_ANCHOR_MISSING)
    if not record.gene_anchors:
        blockers.add(Blocker.GENE_ANCHOR_MISSING)
    if record.raw_messages_stored:
        blockers.add(Blocker.RAW_MESSAGES_FORBIDDEN)
    if not preview_flags_hold(record):
        blockers.add(Blocker.PREVIEW_FLAGS_INVALID)
    if not compacted_turns_hold(record):
        blockers.add(Blocker.COMPACTED_TURNS_INVALID)
    if record.state_digest != record.computed_state_digest():
        blockers.add(Blocker.DIGEST_MISMATCH)
    return sorted(blockers)


def preview_flags_hold(record: SessionStateRecord) -> bool:
    """The record's fixed flags (docs/api.md): a record is a read-only, preview-only report."""
    return (
        record.read_only and record.report_only and record.preview_only and not record.write_allowed
    )


def compacted_turns_hold(record: SessionStateRecord) -> bool:
    """The summary's shape: present on v2 records only; empty exactly at the chain's start."""
    summary = record.compacted_turns
    if summary is None:
        return record.schema_ != RECORD_SCHEMA
    if record.schema_ == RECORD_SCHEMA_V1:
        return False
    if summary.count == 0:
        return summary.token_estimate == 0 and summary.digest == GENESIS_DIGEST
    return summary.digest != GENESIS_DIGEST
