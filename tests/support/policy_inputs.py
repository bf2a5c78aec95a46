"""Policy inputs for tests: one valid input per action, changed one gate at a time."""

from __future__ import annotations

from typing import Any

from service.policy.input import PolicyInput

NOW = 1_800_000_000
SCOPE = {"tenant_id": "tenant-a", "workspace_id": "ws-1", "session_id": "chat-1"}
RECORD = {
    "schema": "sessionstate.record.v2",
    "state_id": "state-1",
    "state_digest": "sha256:" + "ab" * 32,
    "digest_valid": True,
    "task_profile": "coding",
    "counts": {
        "memory_anchors": 1,
        "gene_anchors": 1,
        "retrieval_evidence": 0,
        "routing_evidence": 0,
        "turns": 2,
        "compacted_turns": 0,
        "source_trace_ids": 1,
    },
    "flags": {
        "raw_messages_stored": False,
        "read_only": True,
        "report_only": True,
        "preview_only": True,
        "write_allowed": False,
    },
    "blockers": [],
}
APPROVAL = {
    "approval_id": "appr-1",
    "tenant_id": "tenant-a",
    "workspace_id": "ws-1",
    "session_id": None,
    "operator": "op-1",
    "issued_at": NOW - 60,
    "expires_at": NOW + 600,
    "revoked": False,
}
ROLE_OF = {
    "preview": "model-service",
    "write": "model-service",
    "read": "model-service",
    "replay": "model-service",
    "approval.grant": "operator",
    "approval.revoke": "operator",
    "approval.list": "operator",
    "decisions.read": "auditor",
}


def allowed_input(action: str = "write", /, **changes: Any) -> PolicyInput:
    """An input the policy allows for action; `changes` replace top-level parts."""
    document: dict[str, Any] = {
        "action": action,
        "now": NOW,
        "actor": {"sub": "svc-1", "roles": [ROLE_OF[action]], **SCOPE},
        "target": dict(SCOPE),
        "deployment": {"durable_writes_enabled": True},
        "approval": APPROVAL if action in {"write", "preview"} else None,
        "record": RECORD if action in {"write", "preview"} else None,
    }
    document.update(changes)
    return PolicyInput.model_validate(document)
