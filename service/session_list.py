"""`SessionListQuery`: the query string of a workspace's session list, and its cursors.

A cursor names the last session a page showed; the next page starts after it,
in the store's key order of session ids (shorter ids first, ids of one length
byte by byte). Only cursors this service issued are taken: anything else is a
`validation_failed` on `cursor` (rule `invalid_cursor`), never echoed.
"""

from __future__ import annotations

import base64
import json

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from store.scope import is_scope_id

MAX_LIMIT = 1000


class SessionListQuery(BaseModel):
    """`GET .../workspaces/{workspace_id}/sessions`: a page's size and where it starts."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    limit: int = Field(default=100, ge=1, le=MAX_LIMIT, description="sessions per page")
    cursor: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,256}$",
        description="next_cursor of the previous page; only cursors this service issued",
    )

    @field_validator("cursor")
    @classmethod
    def _cursor_is_ours(cls, value: str | None) -> str | None:
        if value is not None and session_after(value) is None:
            raise PydanticCustomError("invalid_cursor", "not a cursor of this service")
        return value

    @property
    def after(self) -> str | None:
        """The session the page starts after; None for the first page."""
        return None if self.cursor is None else session_after(self.cursor)


def encode_cursor(session_id: str) -> str:
    """The cursor of the page after the one whose last session is `session_id`."""
    document = json.dumps({"after": session_id}).encode()
    return base64.urlsafe_b64encode(document).decode().rstrip("=")


def session_after(cursor: str) -> str | None:
    """The session a cursor starts after; None when it is not a cursor of this service."""
    try:
        document = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except ValueError:
        return None
    if not isinstance(document, dict) or set(document) != {"after"}:
        return None
    after = document["after"]
    return after if is_scope_id(after) else None
