"""What a fork is sent: `POST .../fork`'s body.

`to_session_id` is checked as a path's scope id is (`invalid_scope_id`, never
normalised), so it is a plain string here: the document names its pattern, and the
route checks it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from store.record.bounds import integral_number
from store.scope import SCOPE_ID_PATTERN
from store.version_lane import MAX_VERSION


class ForkRequest(BaseModel):
    """The body of `POST .../fork`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)

    to_session_id: str = Field(
        description="the session to create, in the same workspace: a scope id, checked as "
        "a path's is (400 invalid_scope_id, never normalised)",
        json_schema_extra={"pattern": SCOPE_ID_PATTERN},
    )
    from_version: (
        Annotated[int, Field(ge=1, le=MAX_VERSION), BeforeValidator(integral_number)] | None
    ) = Field(
        default=None,
        description="the kept version of this session to fork; null or absent: the current one",
    )
