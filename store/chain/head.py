"""Where a decision chain ends, and the timestamps its entries and checkpoints carry.

Shared by the chain (`store.chain`) and its signed checkpoints
(`store.chain.checkpoints`), so neither needs the other's internals.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

GENESIS_HASH = "sha256:" + "0" * 64
NO_TENANT_CHAIN = "~no-tenant"  # the chain of entries that name no tenant; no scope id has "~"
SYSTEM_CHAIN = "~system"  # the deployment's own entries (policy activations); no scope id either
CHAIN_NAME_PATTERN = r"^(~no-tenant|~system|[A-Za-z0-9_-][A-Za-z0-9._-]{0,127})$"
HASH_PATTERN = r"^sha256:[0-9a-f]{64}$"
TIMESTAMP_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$"

_TIMESTAMP_RE = re.compile(TIMESTAMP_PATTERN)


class ChainHead(BaseModel):
    """Where the chain ends: the newest entry's seq and hash (the anchor's, or genesis)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    seq: int = Field(ge=0)
    hash: str = Field(pattern=HASH_PATTERN)


GENESIS = ChainHead(seq=0, hash=GENESIS_HASH)


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds and `Z`: the form of `recorded_at` and `issued_at`."""
    if moment.utcoffset() is None:
        raise ValueError("timestamp must be timezone-aware")
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_timestamp(value: object) -> datetime | None:
    """The moment an RFC 3339 UTC `...Z` string names; None for anything else."""
    if not isinstance(value, str) or _TIMESTAMP_RE.fullmatch(value) is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:  # well-shaped but not a date, e.g. month 13
        return None
