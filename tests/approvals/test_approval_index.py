"""The approvals' index: the lookup a write makes reads the approval that applies, not the
workspace's expired, revoked or other sessions' approvals; expired ones are pruned from the
index and kept as history; a store written before the index is read as before until `db
upgrade` indexes it. On LevelDB and on PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from service.approvals.index import (
    index_approvals,
    mark_index_complete_if_empty,
    prune_expired_index,
)
from service.approvals.lookup import ApprovalStore
from service.approvals.model import (
    INDEX_COMPLETE,
    Approval,
    ApprovalGrantInput,
    index_key,
    stored_form,
)
from service.approvals.writes import approval_writes, new_approval, revocation
from service.cli import main
from service.decisions.journal import DecisionJournal
from store.backends.contract import Lanes
from store.backends.leveldb import LevelDBLaneStore
from tests.support.counting_lanes import CountingLanes
from tests.support.factories import decision_entry_body, scope
from tests.support.journalled_approvals import JournalledApprovals
from tests.support.live import DIGEST_KEY, JWT_SECRET

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
TENANT, WORKSPACE = "tenant-a", "ws-1"


@pytest.fixture
def lanes(lanes_on_both: Lanes) -> Lanes:
    return lanes_on_both


@pytest.fixture
def journal(lanes: Lanes) -> Iterator[DecisionJournal]:
    journal = DecisionJournal(lanes)
    yield journal
    journal.close()


@pytest.fixture
def approvals(lanes: Lanes, journal: DecisionJournal) -> JournalledApprovals:
    assert mark_index_complete_if_empty(lanes)  # a new store: its index is complete
    return JournalledApprovals(lanes, journal)


def grant(
    approvals: JournalledApprovals,
    session_id: str | None = "chat-1",
    *,
    ttl: int = 600,
    at: datetime = NOW,
    workspace: str = WORKSPACE,
) -> Approval:
    wanted = ApprovalGrantInput(session_id=session_id, ttl_seconds=ttl, reason="tests")
    return approvals.grant(TENANT, workspace, wanted, "op-1", at)


def test_the_lookup_of_a_write_reads_only_what_applies(
    lanes: Lanes, journal: DecisionJournal
) -> None:
    counted = CountingLanes(lanes)
    assert mark_index_complete_if_empty(lanes)
    approvals = JournalledApprovals(counted, journal)  # type: ignore[arg-type]
    for n in range(40):
        grant(approvals, ttl=60, at=NOW - timedelta(hours=1, seconds=n))  # expired
        revoked = grant(approvals, ttl=7200)
        approvals.revoke(TENANT, WORKSPACE, revoked.approval_id, NOW)  # revoked, in its time
        grant(approvals, f"chat-other-{n}", ttl=7200)  # other sessions'
        grant(approvals, None, ttl=60, at=NOW - timedelta(hours=2))  # expired, workspace-wide
    applies = grant(approvals, ttl=3600)
    assert approvals.index_complete()  # read once, then known
    counted.scanned = counted.got = 0
    assert approvals.covering(scope(), NOW) == applies
    # its index key and the approval: the scan stops before the keys of expired ones
    assert (counted.scanned, counted.got) == (1, 1)
    counted.scanned = counted.got = 0
    assert approvals.covering(scope(session="chat-none"), NOW) is None
    assert (counted.scanned, counted.got) == (0, 0)  # the workspace's keys all expired


def test_a_revoked_approval_is_not_applied_and_leaves_the_index(
    approvals: JournalledApprovals,
) -> None:
    own = grant(approvals)
    workspace_wide = grant(approvals, None)
    assert approvals.covering(scope(), NOW) == own
    approvals.revoke(TENANT, WORKSPACE, own.approval_id, NOW)
    assert approvals.covering(scope(), NOW) == workspace_wide
    assert approvals._lanes.get(index_key(own)) is None
    approvals.revoke(TENANT, WORKSPACE, workspace_wide.approval_id, NOW)
    assert approvals.covering(scope(), NOW) is None
    assert approvals.active(TENANT, WORKSPACE, NOW) == []


def test_other_sessions_approvals_are_not_applied(approvals: JournalledApprovals) -> None:
    grant(approvals, "chat-2")
    grant(approvals, "chat-1", workspace="ws-2")
    assert approvals.covering(scope(), NOW) is None
    theirs = approvals.covering(scope(session="chat-2"), NOW)
    assert theirs is not None and theirs.session_id == "chat-2"


def test_of_several_expiring_at_once_the_greatest_id_applies(
    approvals: JournalledApprovals,
) -> None:
    """As before the index: the greatest (expires_at, approval_id) in force."""
    granted = [grant(approvals, ttl=600) for _ in range(4)]
    greatest = max(granted, key=lambda approval: approval.approval_id)
    assert approvals.covering(scope(), NOW) == greatest
    approvals.revoke(TENANT, WORKSPACE, greatest.approval_id, NOW)
    rest = max((a for a in granted if a != greatest), key=lambda approval: approval.approval_id)
    assert approvals.covering(scope(), NOW) == rest


def test_of_several_the_one_that_expires_last_applies(approvals: JournalledApprovals) -> None:
    grant(approvals, ttl=600)
    longest = grant(approvals, ttl=900)
    grant(approvals, ttl=300)
    assert approvals.covering(scope(), NOW) == longest
    assert approvals.covering(scope(), NOW + timedelta(seconds=899)) == longest
    assert approvals.covering(scope(), NOW + timedelta(seconds=900)) is None


def test_expired_approvals_are_pruned_from_the_index_and_kept_as_history(
    approvals: JournalledApprovals, lanes: Lanes
) -> None:
    expired = grant(approvals, ttl=1, at=NOW - timedelta(seconds=5))
    current = grant(approvals, ttl=600)
    assert prune_expired_index(lanes, NOW) == 1
    assert lanes.get(index_key(expired)) is None
    assert lanes.get(index_key(current)) == b""
    assert approvals.get(TENANT, WORKSPACE, expired.approval_id) == expired  # history
    assert approvals.covering(scope(), NOW) == current
    assert approvals.active(TENANT, WORKSPACE, NOW) == [current]
    assert prune_expired_index(lanes, NOW) == 0
    assert lanes.get(INDEX_COMPLETE) is not None  # the marker is not an approval's key


def test_an_index_key_left_for_a_revoked_approval_does_not_apply(
    approvals: JournalledApprovals, lanes: Lanes
) -> None:
    """As an upgrade racing a revocation could leave: the approval itself decides."""
    granted = grant(approvals)
    approvals.revoke(TENANT, WORKSPACE, granted.approval_id, NOW)
    lanes.put(index_key(granted), b"")
    assert approvals.covering(scope(), NOW) is None
    assert approvals.active(TENANT, WORKSPACE, NOW) == []


def test_an_index_key_is_checked_against_the_approval_it_names(
    approvals: JournalledApprovals, lanes: Lanes
) -> None:
    """A key under another session, or with another expiry, than its approval's is not it."""
    granted = grant(approvals, "chat-2", ttl=60)
    moved = Approval.model_validate({**granted.model_dump(), "session_id": "chat-1"})
    lanes.put(index_key(moved), b"")
    later = Approval.model_validate({**granted.model_dump(), "expires_at": NOW + timedelta(days=1)})
    lanes.put(index_key(later.model_copy(update={"session_id": "chat-2"})), b"")
    assert approvals.covering(scope(), NOW) is None
    assert approvals.covering(scope(session="chat-2"), NOW + timedelta(hours=1)) is None


def test_the_journal_commits_an_approval_with_its_index_key_and_a_revocation_without(
    lanes: Lanes, journal: DecisionJournal
) -> None:
    approval = new_approval(
        TENANT, WORKSPACE, ApprovalGrantInput(ttl_seconds=600, reason="r"), "op-1", NOW
    )
    journal.record_effect(
        decision_entry_body("grant-1"), status=201, puts=approval_writes(approval)
    )
    assert lanes.get(index_key(approval)) == b""
    revoked = revocation(approval, NOW)
    assert revoked is not None
    entry = journal.record_effect(
        decision_entry_body("revoke-1"), status=204, puts=approval_writes(revoked)
    )
    assert entry["outcome"]["applied"] is True
    assert lanes.get(index_key(approval)) is None
    assert lanes.get(stored_form(revoked)[0]) == stored_form(revoked)[1]


def legacy(lanes: Lanes, now: datetime = NOW) -> dict[str, Approval]:
    """Approvals as a store written before the index holds them: no index keys at all."""
    made = {
        "applies": new_approval(
            TENANT, WORKSPACE, ApprovalGrantInput(session_id="chat-1", ttl_seconds=600, reason="r"),
            "op-1", now,
        ),
        "expired": new_approval(
            TENANT, WORKSPACE, ApprovalGrantInput(ttl_seconds=60, reason="r"),
            "op-1", now - timedelta(hours=1),
        ),
        "revoked": new_approval(
            TENANT, WORKSPACE, ApprovalGrantInput(ttl_seconds=900, reason="r"), "op-1", now,
        ),
    }  # fmt: skip
    made["revoked"] = revocation(made["revoked"], now) or made["revoked"]
    for approval in made.values():
        lanes.put(*stored_form(approval))
    return made


def test_a_store_from_before_the_index_is_read_as_before_until_indexed(lanes: Lanes) -> None:
    made = legacy(lanes)
    assert not mark_index_complete_if_empty(lanes)  # it holds approvals: not marked
    approvals = ApprovalStore(lanes)
    assert not approvals.index_complete()
    assert approvals.covering(scope(), NOW) == made["applies"]  # by reading every approval
    assert index_approvals(lanes, NOW) == 1  # only what may still apply
    assert approvals.index_complete()
    assert approvals.covering(scope(), NOW) == made["applies"]
    assert approvals.active(TENANT, WORKSPACE, NOW) == [made["applies"]]
    assert lanes.get(index_key(made["expired"])) is None
    assert lanes.get(index_key(made["revoked"])) is None
    assert index_approvals(lanes, NOW) == 1  # safe to run again


def test_db_upgrade_indexes_a_data_dirs_approvals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "var"
    store = LevelDBLaneStore(data_dir / "leveldb")
    made = legacy(store, datetime.now(UTC))
    store.close()
    for name, value in {
        "SESSIONSTATE_DATA_DIR": str(data_dir),
        "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["db", "upgrade"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["changed"] is True
    assert printed["approvals_indexed"] == 1  # the one that may still apply
    assert main(["db", "upgrade"]) == 0
    assert json.loads(capsys.readouterr().out)["approvals_indexed"] is None
    store = LevelDBLaneStore(data_dir / "leveldb")
    try:
        assert ApprovalStore(store).index_complete()
        assert store.get(index_key(made["revoked"])) is None
    finally:
        store.close()
