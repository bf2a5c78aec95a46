"""`SessionStateWriteReport` and `SessionStateReadReport`: what a write or read did."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from store.digests import Digest
from store.reasons import CorruptionLabel
from store.record import SessionStateRecord


class SessionStateWriteReport(BaseModel):
    """Whether a record was written, and every reason it was not."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    applied: bool
    durable_write_requested: bool
    key_digest: Digest
    blocked_reasons: list[str] = Field(default_factory=list)
    read_only: Literal[True] = True
    report_only: Literal[True] = True

    @computed_field  # type: ignore[prop-decorator]
    @property
    def preview_only(self) -> bool:
        """A report is preview-only unless the record was written."""
        return not self.applied


class SessionStateReadReport(BaseModel):
    """A read that fails closed: a corrupt record comes back as a label and a digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_digest: Digest
    record: SessionStateRecord | None
    corrupt: bool
    redacted_error: CorruptionLabel | None = None
    error_digest: Digest | None = Field(
        default=None, description="sha256 of the stored bytes, to match storage evidence"
    )
    raw_payload_exposed: Literal[False] = False
