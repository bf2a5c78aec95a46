"""`DecisionQuery`: the filters of a decision log listing or export, and its cursors.

The query string's wire shape (the OpenAPI document lists it parameter by
parameter) and what it selects. A cursor holds the seqs the next pages may
show: oldest first, after the last one shown up to the head the first page saw
(reading the log adds to it, so without a fixed end a reader following cursors
would never finish); newest first (`order=desc`), below the last one shown, so
they too stay within the head the first page saw. A cursor says its order, and
is refused with the other one.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from service.decisions.log import DecisionLogEntry
from service.policy.input import PolicyAction
from store.chain.tlog_checkpoint import MAX_TREE_SIZE
from store.scope import ScopeId

MAX_LIMIT = 1000
Order = Literal["asc", "desc"]


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
    order: Order = Field(
        default="asc",
        description="asc: oldest first (chain order); desc: newest first. Cursors continue "
        "in the order of the page that issued them",
    )
    cursor: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,128}$",
        description="next_cursor of the previous page, sent with the same order and "
        "filters; only cursors this service issued",
    )

    @field_validator("cursor")
    @classmethod
    def _cursor_is_ours(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            try:
                _, _, order = decode_cursor(value)
            except ValueError:
                order = None
            if order is None or order != info.data.get("order", order):
                raise PydanticCustomError("invalid_cursor", "not a cursor of this service")
        return value

    def window(self) -> tuple[int, int | None]:
        """The seqs a page may show: after `after` up to `until` (None: to the head now)."""
        if self.cursor is None:
            return 0, None
        after, until, _ = decode_cursor(self.cursor)
        return after, until

    def next_cursor(self, last_seq: int, after: int, until: int) -> str:
        """The cursor of the page after one of window (after, until] whose last entry is
        last_seq: the seqs beyond it in this order, within the same window."""
        if self.order == "desc":
            return encode_cursor(after, last_seq - 1, "desc")
        return encode_cursor(last_seq, until, "asc")

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


def encode_cursor(after: int, until: int, order: Order = "asc") -> str:
    """A page window (seqs after `after` up to `until`) and its order, as a cursor."""
    window = {"after": after, "until": until}
    document = json.dumps(window if order == "asc" else window | {"order": order}).encode()
    return base64.urlsafe_b64encode(document).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, int, Order]:
    """(after, until, order) of a cursor; a cursor without an order is an oldest-first one,
    as cursors were before `order` existed."""
    try:
        document = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        after, until = document["after"], document["until"]
        order = document.get("order", "asc")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError("not a cursor of this service") from None
    for value in (after, until):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("not a cursor of this service")
    if order not in ("asc", "desc") or set(document) - {"after", "until", "order"}:
        raise ValueError("not a cursor of this service")
    return after, until, order


class CheckpointQuery(BaseModel):
    """The query string of `GET /v1/decisions/log-key` (and the checkpoint's tenant)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    tenant_id: ScopeId | None = None


class CheckpointNoteQuery(CheckpointQuery):
    """The query string of `GET /v1/decisions/checkpoint` and of its `/timestamp`."""

    tree_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TREE_SIZE,
        description="the kept note of this tree size, up to the latest note's (unset: the "
        "newest note timestamped, with SESSIONSTATE_TSA_URL, and cosigned by the witnesses' "
        "quorum, with witnesses; while none is, the newest the quorum cosigned, else the "
        "latest)",
    )


class InclusionQuery(BaseModel):
    """The query string of `GET /v1/decisions/{decision_id}/inclusion`."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    tree_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TREE_SIZE,
        description="the tree to prove the entry in: from its seq to the latest checkpoint "
        "note's size (unset: that size)",
    )


class ConsistencyQuery(BaseModel):
    """The query string of `GET /v1/decisions/consistency`."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    tenant_id: ScopeId | None = None
    first: int = Field(ge=1, le=MAX_TREE_SIZE, description="the older tree's size, from 1")
    second: int = Field(
        ge=1, le=MAX_TREE_SIZE, description="the newer's, at most the latest note's size"
    )
