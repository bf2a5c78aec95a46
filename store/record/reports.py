"""`SessionStateWriteReport` and `SessionStateReadReport`: what a write or read did."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from store.digests import Digest
from store.record.blockers import CorruptionLabel
from store.record.state_record import SessionStateRecord


class SessionStateWriteReport(BaseModel):
    """Whether a record was written, and every reason it was not."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    applied: bool
    durable_write_requested: bool
    key_digest: Digest
    blocked_reasons: list[str] = Field(default_factory=list)
    read_only: Literal[True] = True
    report_only: Literal[True] = True
    preview_only: bool = Field(
        default=True, description="true unless the record was written: always `not applied`"
    )

    @model_validator(mode="before")
    @classmethod
    def _preview_only_follows_applied(cls, data: Any) -> Any:
        """Derived when absent, checked when given: one model reads what it writes."""
        if isinstance(data, dict) and isinstance(data.get("applied"), bool):
            expected = not data["applied"]
            data = {"preview_only": expected, **data}
            if data["preview_only"] != expected:
                raise PydanticCustomError(
                    "preview_only_contradicts_applied", "preview_only must be `not applied`"
                )
        return data


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
