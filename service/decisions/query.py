"""`DecisionQuery`: the filters of a decision log listing or export, and its cursors.

The query string's wire shape (the OpenAPI document lists it parameter by
parameter) and what it selects. A cursor holds where the next page starts and
the head the first page saw: reading the log adds to it, so without a fixed end
a reader following cursors would never finish.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from service.decisions.log import DecisionLogEntry
from service.policy.input import PolicyAction
from store.scope import ScopeId

MAX_LIMIT = 1000


class DecisionQuery(BaseModel):
    """Filters of the list and the export, from the query string."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    tenant_id: ScopeId | None = None
    action: PolicyAction | None = None
    allow: Literal["true", "false"] | None = None
    since: AwareDatetime | None = None
    until: AwareDatetime | None = None
    shadow: Literal["agree", "disagree"] | None = Field(
        default=None,
        description="with a shadow policy set: only entries whose shadow decision agrees, or "
        "only those where it disagrees (allow gained or lost, or other reasons)",
    )
    limit: int = Field(
        default=100,
        ge=1,
        le=MAX_LIMIT,
        description="entries per page; the export applies it only when it is given "
        "(then the next page's cursor is in the Sessionstate-Next-Cursor header)",
    )
    cursor: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="next_cursor of the previous page; only cursors this service issued",
    )

    @field_validator("cursor")
    @classmethod
    def _cursor_is_ours(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                decode_cursor(value)
            except ValueError:
                raise PydanticCustomError(
                    "invalid_cursor", "not a cursor of this service"
                ) from None
        return value

    def window(self) -> tuple[int, int | None]:
        """The seqs a page may show: after the cursor, up to the head the first page saw."""
        return (0, None) if self.cursor is None else decode_cursor(self.cursor)

    def matches(self, entry: DecisionLogEntry) -> bool:
        decision = entry.decision
        if self.action is not None and decision.action != self.action:
            return False
        if self.allow is not None and decision.allow != (self.allow == "true"):
            return False
        if self.shadow is not None and (
            entry.shadow is None or entry.shadow.agrees is not (self.shadow == "agree")
        ):
            return False
        evaluated = datetime.fromisoformat(decision.evaluated_at)
        if self.since is not None and evaluated < self.since:
            return False
        return self.until is None or evaluated < self.until


class RevisionsQuery(BaseModel):
    """The query string of `GET /v1/decisions/policy-revisions`."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    tenant_id: ScopeId | None = None


class VerifyQuery(BaseModel):
    """The query string of `GET /v1/decisions/verify`."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    full: Literal["true", "false"] = Field(
        default="false",
        description="true: walk the whole chain from its start (or the retention anchor); "
        "else only the entries after the head the last verify signed, when that head's "
        "entry still holds its signed hash",
    )


def encode_cursor(after: int, until: int) -> str:
    """Where the next page starts (after seq `after`), and the last seq any page shows."""
    document = json.dumps({"after": after, "until": until}).encode()
    return base64.urlsafe_b64encode(document).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, int]:
    try:
        document = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        after, until = document["after"], document["until"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("not a cursor of this service") from None
    for value in (after, until):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("not a cursor of this service")
    return after, until
