"""Record validation blockers: why a record may not be written or trusted."""

from __future__ import annotations

from store.reasons import Blocker
from store.record import RECORD_SCHEMA, SessionStateRecord


def record_blockers(record: SessionStateRecord) -> list[Blocker]:
    """Every blocker of a record, sorted; empty when it may be written."""
    blockers: set[Blocker] = set()
    if record.schema_ != RECORD_SCHEMA:
        blockers.add(Blocker.SCHEMA_MISMATCH)
    if not record.memory_anchors:
        blockers.add(Blocker.MEMORY_ANCHOR_MISSING)
    if not record.gene_anchors:
        blockers.add(Blocker.GENE_ANCHOR_MISSING)
    if record.raw_messages_stored:
        blockers.add(Blocker.RAW_MESSAGES_FORBIDDEN)
    if not preview_flags_hold(record):
        blockers.add(Blocker.PREVIEW_FLAGS_INVALID)
    if record.state_digest != record.computed_state_digest():
        blockers.add(Blocker.DIGEST_MISMATCH)
    return sorted(blockers)


def preview_flags_hold(record: SessionStateRecord) -> bool:
    """The design note's default flags: a record is a read-only, preview-only report."""
    return (
        record.read_only and record.report_only and record.preview_only and not record.write_allowed
    )
