"""What the versions routes are sent: the listing's query and its cursors, a rewind's body.

A listing's cursor is the decision log's newest-first one (`service.decisions.query`):
the versions below the last one shown, so following cursors always ends.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from service.decisions.query import decode_cursor, encode_cursor
from store.record.bounds import JsonInt
from store.version_lane import MAX_VERSION

MAX_VERSIONS_PAGE = 100


class VersionsQuery(BaseModel):
    """The query string of `GET .../state/versions`."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    limit: int = Field(default=20, ge=1, le=MAX_VERSIONS_PAGE, description="versions per page")
    cursor: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,128}$",
        description="next_cursor of the previous page; only cursors this service issued",
    )

    @field_validator("cursor")
    @classmethod
    def _cursor_is_ours(cls, value: str | None) -> str | None:
        if value is not None and _below(value) is None:
            raise PydanticCustomError("invalid_cursor", "not a cursor of this service")
        return value

    def below(self) -> int | None:
        """The versions the page may show are below this number (None: every one)."""
        return None if self.cursor is None else _below(self.cursor)


def next_cursor(last_shown: int) -> str:
    """The cursor of the page after one whose oldest version is `last_shown`."""
    return encode_cursor(0, last_shown - 1, "desc")


def _below(cursor: str) -> int | None:
    try:
        after, until, order = decode_cursor(cursor)
    except ValueError:
        return None
    if order != "desc" or after != 0 or until >= MAX_VERSION:
        return None
    return until + 1


class RewindRequest(BaseModel):
    """The body of `POST .../state/rewind`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)

    to_version: JsonInt = Field(
        ge=1, le=MAX_VERSION, description="the kept version whose record to restore"
    )
