"""Reason codes the store itself produces (the policies use the same strings)."""

from __future__ import annotations

from enum import StrEnum


class Blocker(StrEnum):
    """Why a record may not be written: record validation blockers."""

    MEMORY_ANCHOR_MISSING = "session_state_memory_anchor_missing"
    GENE_ANCHOR_MISSING = "session_state_gene_anchor_missing"
    RAW_MESSAGES_FORBIDDEN = "session_state_raw_messages_forbidden"
    PREVIEW_FLAGS_INVALID = "session_state_preview_flags_invalid"
    SCHEMA_MISMATCH = "session_state_schema_mismatch"
    DIGEST_MISMATCH = "session_state_digest_mismatch"
    COMPACTED_TURNS_INVALID = "session_state_compacted_turns_invalid"


class CorruptionLabel(StrEnum):
    """The fixed vocabulary of redacted errors for a stored record that fails to read."""

    MALFORMED = "session_state_malformed"
    SCHEMA_MISMATCH = "session_state_schema_mismatch"
    DIGEST_MISMATCH = "session_state_digest_mismatch"
    SCOPE_MISMATCH = "session_state_scope_mismatch"
    VALIDATION_FAILED = "session_state_validation_failed"
