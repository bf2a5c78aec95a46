"""A forked record: a session version's record as the first record of another session.

The fork keeps the source's content (anchors, turns, summary) and names the target's
scope and where it came from (`lineage.forked_from`); its state digest covers both, so
the lineage cannot be changed without the record reading as corrupt.
"""

from __future__ import annotations

import json

from store.record.state_record import (
    ForkedFrom,
    Lineage,
    SessionStateRecord,
    compute_state_digest,
)
from store.scope import TenantScope


def forked_record(
    source: SessionStateRecord, version: int, target: TenantScope
) -> SessionStateRecord:
    """Version `version` of a session's record (`source`) as target's record."""
    origin = source.scope
    lineage = Lineage(
        forked_from=ForkedFrom(
            tenant_id=origin.tenant_id,
            workspace_id=origin.workspace_id,
            session_id=origin.session_id,
            version=version,
            state_digest=source.state_digest,
        )
    )
    content = {
        **source.content(),
        "scope": target.model_dump(mode="json"),
        "lineage": lineage.model_dump(mode="json"),
    }
    signed = {**content, "state_digest": compute_state_digest(content)}
    return SessionStateRecord.model_validate_json(json.dumps(signed), strict=True)
