"""Tenant scope ids: validated exactly, never normalised."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

SCOPE_ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"
_SCOPE_ID_RE = re.compile(SCOPE_ID_PATTERN)

ScopeId = Annotated[str, StringConstraints(pattern=SCOPE_ID_PATTERN)]


def is_scope_id(value: object) -> bool:
    """True when value is a scope id exactly as given (no trimming, no case folding)."""
    # fullmatch rather than match: `$` would also accept a trailing newline.
    return isinstance(value, str) and _SCOPE_ID_RE.fullmatch(value) is not None


class TenantScope(BaseModel):
    """Tenant, workspace and session a record belongs to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_id: ScopeId
    workspace_id: ScopeId
    session_id: ScopeId
