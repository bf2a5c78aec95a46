"""Operator approvals on a real LevelDB: bounded in time, revocable at once, never stretched
to another session, workspace or tenant. Granted and revoked through the decision journal, as
the routes do."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from service.approvals.index import mark_index_complete_if_empty
from service.approvals.model import Approval, ApprovalGrantInput, approval_key
from service.decisions.journal import DecisionJournal
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_json
from tests.support.factories import scope
from tests.support.journalled_approvals import JournalledApprovals

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
TENANT, WORKSPACE = "tenant-a", "ws-1"


@pytest.fixture
def journal(lanes: LevelDBLaneStore) -> Iterator[DecisionJournal]:
    journal = DecisionJournal(lanes)
    yield journal
    journal.close()


@pytest.fixture(params=["indexed", "not indexed yet"])
def approvals(
    request: pytest.FixtureRequest, lanes: LevelDBLaneStore, journal: DecisionJournal
) -> JournalledApprovals:
    """Every rule holds through the approvals' index, and on a store written before it."""
    if request.param == "indexed":
        assert mark_index_complete_if_empty(lanes)
    return JournalledApprovals(lanes, journal)


def grant_input(session_id: str | None = None, ttl_seconds: int = 600) -> ApprovalGrantInput:
    return ApprovalGrantInput(session_id=session_id, ttl_seconds=ttl_seconds, reason="incident 42")


def grant(
    approvals: JournalledApprovals,
    session_id: str | None = None,
    *,
    tenant: str = TENANT,
    workspace: str = WORKSPACE,
    ttl_seconds: int = 600,
    at: datetime = NOW,
) -> Approval:
    return approvals.grant(tenant, workspace, grant_input(session_id, ttl_seconds), "op-1", at)


def test_granted_approval_reads_back_whole(approvals: JournalledApprovals) -> None:
    granted = grant(approvals, "chat-1")
    assert re.fullmatch(r"appr_[0-9a-f]{24}", granted.approval_id)
    assert (granted.tenant_id, granted.workspace_id, granted.session_id) == (
        TENANT,
        WORKSPACE,
        "chat-1",
    )
    assert (granted.operator, granted.reason) == ("op-1", "incident 42")
    assert granted.issued_at == NOW
    assert granted.expires_at == NOW + timedelta(seconds=600)
    assert granted.revoked_at is None
    assert approvals.get(TENANT, WORKSPACE, granted.approval_id) == granted


def test_approval_ids_are_fresh(approvals: JournalledApprovals) -> None:
    assert grant(approvals).approval_id != grant(approvals).approval_id


def test_times_serialise_as_rfc3339_utc_with_z(approvals: JournalledApprovals) -> None:
    at = datetime(2025, 3, 1, 13, 0, 0, 750_000, tzinfo=UTC)
    wire = grant(approvals, at=at).model_dump(mode="json")
    assert wire["issued_at"] == "2025-03-01T13:00:00Z"  # whole seconds, as the policy sees them
    assert wire["expires_at"] == "2025-03-01T13:10:00Z"
    assert wire["revoked_at"] is None
    assert wire["session_id"] is None


def test_times_given_in_another_offset_are_held_in_utc(approvals: JournalledApprovals) -> None:
    at = NOW.astimezone(datetime.fromisoformat("2025-01-01T00:00:00+05:30").tzinfo)
    wire = grant(approvals, at=at).model_dump(mode="json")
    assert wire["issued_at"] == "2025-03-01T12:00:00Z"


def test_stored_value_is_the_canonical_json_of_the_wire_shape(
    approvals: JournalledApprovals, lanes: LevelDBLaneStore
) -> None:
    granted = grant(approvals)
    stored = lanes.get(approval_key(TENANT, WORKSPACE, granted.approval_id))
    assert stored == canonical_json(granted.model_dump(mode="json"))


def test_active_lists_approvals_in_force_oldest_first(approvals: JournalledApprovals) -> None:
    later = grant(approvals, "chat-2", at=NOW + timedelta(seconds=5))
    earlier = grant(approvals, "chat-1")
    expired = grant(approvals, ttl_seconds=1, at=NOW - timedelta(seconds=10))
    revoked = grant(approvals)
    approvals.revoke(TENANT, WORKSPACE, revoked.approval_id, NOW + timedelta(seconds=6))
    listed = approvals.active(TENANT, WORKSPACE, NOW + timedelta(seconds=10))
    assert listed == [earlier, later]
    # Expired and revoked approvals stay stored as history.
    assert approvals.get(TENANT, WORKSPACE, expired.approval_id) == expired
    stored_revoked = approvals.get(TENANT, WORKSPACE, revoked.approval_id)
    assert stored_revoked is not None and stored_revoked.revoked_at is not None


def test_an_approval_is_in_force_from_issue_until_just_before_expiry(
    approvals: JournalledApprovals,
) -> None:
    granted = grant(approvals, ttl_seconds=60)
    assert not granted.active(NOW - timedelta(seconds=1))
    assert granted.active(NOW)
    assert granted.active(NOW + timedelta(seconds=59))
    assert not granted.active(NOW + timedelta(seconds=60))
    assert approvals.active(TENANT, WORKSPACE, NOW + timedelta(seconds=60)) == []


def test_revoke_is_immediate_and_idempotent(approvals: JournalledApprovals) -> None:
    granted = grant(approvals, "chat-1")
    first = approvals.revoke(TENANT, WORKSPACE, granted.approval_id, NOW + timedelta(seconds=1))
    assert first is not None and first.revoked_at == NOW + timedelta(seconds=1)
    assert approvals.covering(scope(), NOW + timedelta(seconds=1)) is None
    assert approvals.active(TENANT, WORKSPACE, NOW + timedelta(seconds=1)) == []
    again = approvals.revoke(TENANT, WORKSPACE, granted.approval_id, NOW + timedelta(seconds=9))
    assert again == first
    assert approvals.get(TENANT, WORKSPACE, granted.approval_id) == first


def test_revoking_an_unknown_approval_finds_nothing(approvals: JournalledApprovals) -> None:
    granted = grant(approvals)
    assert approvals.revoke(TENANT, WORKSPACE, "appr_" + "0" * 24, NOW) is None
    assert approvals.revoke(TENANT, "ws-2", granted.approval_id, NOW) is None
    assert approvals.revoke("tenant-b", WORKSPACE, granted.approval_id, NOW) is None
    assert approvals.active(TENANT, WORKSPACE, NOW) == [granted]


@pytest.mark.parametrize(
    "approval_id",
    ["", "appr_", "appr_" + "A" * 24, "appr_" + "0" * 23, "appr_" + "0" * 25, "x" * 300, "../x"],
)
def test_malformed_approval_ids_are_not_looked_up(
    lanes: LevelDBLaneStore, journal: DecisionJournal, approval_id: str
) -> None:
    approvals = JournalledApprovals(lanes, journal)
    journal.close()  # any write would now raise
    lanes.close()  # and any read
    assert approvals.get(TENANT, WORKSPACE, approval_id) is None
    assert approvals.revoke(TENANT, WORKSPACE, approval_id, NOW) is None


def test_covering_prefers_the_sessions_own_approval(approvals: JournalledApprovals) -> None:
    grant(approvals, ttl_seconds=3_600)
    own = grant(approvals, "chat-1", ttl_seconds=60)
    assert approvals.covering(scope(session="chat-1"), NOW) == own


def test_covering_picks_the_latest_expiry_among_the_sessions_approvals(
    approvals: JournalledApprovals,
) -> None:
    grant(approvals, "chat-1", ttl_seconds=60)
    longest = grant(approvals, "chat-1", ttl_seconds=600)
    grant(approvals, "chat-1", ttl_seconds=300)
    assert approvals.covering(scope(), NOW) == longest


def test_covering_falls_back_to_a_workspace_approval(approvals: JournalledApprovals) -> None:
    workspace_wide = grant(approvals)
    grant(approvals, "chat-2")
    assert approvals.covering(scope(session="chat-1"), NOW) == workspace_wide


def test_covering_ignores_other_sessions_workspaces_and_tenants(
    approvals: JournalledApprovals,
) -> None:
    grant(approvals, "chat-2")
    grant(approvals, "Chat-1")
    grant(approvals, workspace="ws-2")
    grant(approvals, workspace="WS-1")
    grant(approvals, tenant="tenant-b")
    grant(approvals, tenant="Tenant-A")
    assert approvals.covering(scope(), NOW) is None


def test_covering_tells_tenants_apart_that_differ_only_in_case(
    approvals: JournalledApprovals,
) -> None:
    upper = grant(approvals, tenant="Tenant_A")
    assert approvals.covering(scope(tenant="tenant_a"), NOW) is None
    assert approvals.covering(scope(tenant="Tenant_A"), NOW) == upper
    assert approvals.active("tenant_a", WORKSPACE, NOW) == []


def test_covering_ignores_expired_and_revoked_approvals(approvals: JournalledApprovals) -> None:
    grant(approvals, "chat-1", ttl_seconds=1, at=NOW - timedelta(seconds=5))
    revoked = grant(approvals)
    approvals.revoke(TENANT, WORKSPACE, revoked.approval_id, NOW)
    assert approvals.covering(scope(), NOW) is None


def test_covering_ignores_an_approval_not_yet_issued(approvals: JournalledApprovals) -> None:
    grant(approvals, at=NOW + timedelta(seconds=30))
    assert approvals.covering(scope(), NOW) is None


def unreadable_values(granted: Approval) -> list[bytes]:
    elsewhere: dict[str, Any] = {**granted.model_dump(mode="json"), "tenant_id": "tenant-b"}
    bad_times: dict[str, Any] = {**granted.model_dump(mode="json"), "expires_at": "soon"}
    return [
        b"not json",
        b"\xff\xfe",
        b"[" * 100_000,
        json.dumps(elsewhere).encode(),  # names another tenant than its key
        json.dumps(bad_times).encode(),
    ]


def test_unreadable_stored_values_are_skipped(
    approvals: JournalledApprovals, lanes: LevelDBLaneStore, caplog: pytest.LogCaptureFixture
) -> None:
    granted = grant(approvals)
    for index, value in enumerate(unreadable_values(granted)):
        bad_id = f"appr_{index:024x}"
        lanes.put(approval_key(TENANT, WORKSPACE, bad_id), value)
        assert approvals.get(TENANT, WORKSPACE, bad_id) is None
        assert approvals.revoke(TENANT, WORKSPACE, bad_id, NOW) is None
    assert approvals.active(TENANT, WORKSPACE, NOW) == [granted]
    assert approvals.covering(scope(), NOW) == granted
    assert "skipping an unreadable approval" in caplog.text
    assert "not json" not in caplog.text and "tenant-b" not in caplog.text


def test_to_policy_carries_unix_seconds_and_a_revoked_flag(approvals: JournalledApprovals) -> None:
    granted = grant(approvals, "chat-1", ttl_seconds=90)
    policy = granted.to_policy()
    assert policy.model_dump() == {
        "approval_id": granted.approval_id,
        "tenant_id": TENANT,
        "workspace_id": WORKSPACE,
        "session_id": "chat-1",
        "operator": "op-1",
        "issued_at": int(NOW.timestamp()),
        "expires_at": int(NOW.timestamp()) + 90,
        "revoked": False,
    }
    revoked = approvals.revoke(TENANT, WORKSPACE, granted.approval_id, NOW)
    assert revoked is not None and revoked.to_policy().revoked is True


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"ttl_seconds": 0, "reason": "r"}, "ttl_seconds"),
        ({"ttl_seconds": 86_401, "reason": "r"}, "ttl_seconds"),
        ({"ttl_seconds": 60, "reason": ""}, "reason"),
        ({"ttl_seconds": 60, "reason": "r" * 257}, "reason"),
        ({"ttl_seconds": 60, "reason": "r", "session_id": "chat 1"}, "session_id"),
        ({"ttl_seconds": 60, "reason": "r", "session_id": "chat-1\n"}, "session_id"),
        ({"reason": "r"}, "ttl_seconds"),
        ({"ttl_seconds": 60, "reason": "r", "tenant_id": "t"}, "tenant_id"),
    ],
)
def test_grant_input_is_validated(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ApprovalGrantInput.model_validate(body)
    assert [error["loc"] for error in caught.value.errors()] == [(field,)]
    assert "chat 1" not in str(caught.value)  # inputs are never echoed


def test_grant_input_bounds_are_inclusive() -> None:
    assert ApprovalGrantInput(ttl_seconds=1, reason="r").ttl_seconds == 1
    assert ApprovalGrantInput(ttl_seconds=86_400, reason="r" * 256).session_id is None
