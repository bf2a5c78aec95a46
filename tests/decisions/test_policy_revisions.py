"""Which policy decided when: the revision summaries the journal keeps, read over HTTP, on the
reviewer's page and by `sessionstate decisions revisions`; rebuilt by `db upgrade`; the same
on LevelDB and PostgreSQL."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from service.cli import main
from service.decisions import revisions
from service.decisions.journal import DecisionJournal
from service.decisions.reader import DecisionLogReader
from service.policy.sidecar import OpaSidecar
from service.policy.trace import DecisionEngine
from store.backends.contract import Lanes
from store.backends.leveldb import LevelDBLaneStore
from store.key_codec import TenantResourceLane
from tests.support.factories import decision_entry_body, state_input
from tests.support.live import LiveService, live_service, service_settings
from tests.support.paths import POLICY_DIR

REVISIONS = "/v1/decisions/policy-revisions"


def auditor(service: LiveService, tenant: str = "tenant-a") -> str:
    return service.token("auditor", sub="au-1", tenant=tenant, workspace=None, session=None)


def _traffic(service: LiveService) -> None:
    path = service.session_path() + "/state"
    assert service.call("PUT", path, service.token(), json=state_input()).status_code == 403
    assert service.call("GET", path, service.token()).status_code == 404


def _logged_by_revision(data_dir: Path, tenant: str) -> dict[str, Counter[str]]:
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    try:
        counts: dict[str, Counter[str]] = {}
        for entry in DecisionLogReader(lanes).entries(tenant):
            counts.setdefault(entry.decision.policy_revision, Counter())[entry.decision.action] += 1
        return counts
    finally:
        lanes.close()


@pytest.fixture
def two_revisions(opa_bin: str, tmp_path: Path) -> tuple[Path, list[str]]:
    """A stopped service's data dir whose tenant-a decisions were made under two policy
    revisions: the policies were edited and reloaded in between."""
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    sidecar = OpaSidecar(opa_bin, policies, tmp_path / "opa")
    sidecar.start()
    data_dir = tmp_path / "var"
    try:
        with live_service(sidecar, service_settings(data_dir)) as service:
            first = sidecar.policies.served.revision
            _traffic(service)
            read = policies / "sessionstate" / "read" / "read.rego"
            read.write_text(read.read_text() + "\n# an edit that changes no decision\n")
            assert sidecar.reload_policies().deciding
            second = sidecar.policies.served.revision
            _traffic(service)
            service.approve()
            answer = service.call("GET", REVISIONS, auditor(service))
            assert answer.status_code == 200, answer.text
    finally:
        sidecar.stop()
    return data_dir, [first, second]


def test_the_endpoint_lists_each_revision_with_its_window_and_counts(
    service: LiveService,
) -> None:
    _traffic(service)
    answer = service.call("GET", REVISIONS, auditor(service))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["tenant_id"] == "tenant-a"
    assert body["complete"] is True
    assert body["decision"]["action"] == "decisions.read"
    (revision,) = body["revisions"]
    assert revision["policy_revision"].startswith("sha256:")
    assert revision["by_action"] == {"write": 1, "read": 1}
    assert revision["decisions"] == 2
    assert revision["first_decided_at"] <= revision["last_decided_at"]
    again = service.call("GET", REVISIONS, auditor(service)).json()["revisions"][0]
    assert again["by_action"] == {"write": 1, "read": 1, "decisions.read": 1}  # reading is one


def test_the_endpoint_is_governed_like_the_log(service: LiveService) -> None:
    _traffic(service)
    other = service.call("GET", REVISIONS + "?tenant_id=tenant-a", auditor(service, "tenant-b"))
    assert other.status_code == 403
    assert other.json()["reason"] == "cross_tenant_scope_rejected"
    assert service.call("GET", REVISIONS, service.operator()).status_code == 403
    own = service.call("GET", REVISIONS, auditor(service, "tenant-b")).json()
    assert own["tenant_id"] == "tenant-b"
    # Nothing was decided about tenant-b before this read, but the revision was in force.
    (in_force,) = own["revisions"]
    assert (in_force["decisions"], in_force["by_action"], in_force["failed"]) == (0, {}, 0)
    assert in_force["first_decided_at"] is None
    assert [interval["to"] for interval in in_force["live"]] == [None]
    bad = service.call("GET", REVISIONS + "?tenant_id=..&secret-name=1", auditor(service))
    assert bad.status_code == 422
    assert "secret-name" not in bad.text


def test_a_reload_starts_a_new_revision_and_the_summary_matches_the_log(
    two_revisions: tuple[Path, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_dir, (first, second) = two_revisions
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["decisions", "revisions", "--tenant", "tenant-a"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["complete"] is True
    listed = printed["tenants"]["tenant-a"]
    assert [r["policy_revision"] for r in listed] == [first, second]
    older, newer = listed
    assert datetime.fromisoformat(older["last_decided_at"]) <= datetime.fromisoformat(
        newer["first_decided_at"]
    )
    logged = _logged_by_revision(data_dir, "tenant-a")
    assert {r["policy_revision"]: Counter(r["by_action"]) for r in listed} == logged


def test_db_upgrade_summarises_a_log_written_before_the_summaries(
    two_revisions: tuple[Path, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_dir, _ = two_revisions
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["decisions", "revisions"]) == 0
    kept = json.loads(capsys.readouterr().out)
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    try:  # as a store of the release before: no summaries, not marked complete
        with lanes.batch() as batch:
            for key, _ in lanes.scan(TenantResourceLane.TRACE_META):
                if key.name.startswith(b"revision") or key == revisions.SUMMARIES_COMPLETE:
                    batch.delete(key)
    finally:
        lanes.close()
    assert main(["decisions", "revisions"]) == 0
    emptied = json.loads(capsys.readouterr().out)
    assert emptied["complete"] is False
    # What was live is still listed (it is the deployment's, not the summaries'), deciding nothing.
    assert all(
        r["decisions"] == 0 and r["live"] for listed in emptied["tenants"].values() for r in listed
    )
    assert main(["db", "upgrade"]) == 0
    upgraded = json.loads(capsys.readouterr().out)
    assert upgraded["revisions_summarised"] == 2  # tenant-a's chain: one per revision
    assert upgraded["changed"] is True
    assert main(["decisions", "revisions"]) == 0
    assert json.loads(capsys.readouterr().out) == kept
    assert main(["db", "upgrade"]) == 0
    assert json.loads(capsys.readouterr().out)["revisions_summarised"] is None


def test_the_reviewer_page_shows_which_policy_decided_when(service: LiveService) -> None:
    _traffic(service)
    browser = requests.Session()
    signed = browser.post(
        service.url + "/ui/login", data={"token": auditor(service)}, allow_redirects=False
    )
    assert signed.status_code == 303
    page = browser.get(service.url + "/ui/decisions", timeout=10)
    assert page.status_code == 200
    assert "Which policy decided when" in page.text
    revision = service.call("GET", REVISIONS, auditor(service)).json()["revisions"][0]
    assert revision["policy_revision"] in page.text
    (interval,) = revision["live"]  # live since the service started, and still
    assert f'<time datetime="{interval["from"]}">' in page.text
    assert "Live (UTC)" in page.text and "Failed" in page.text
    assert "not summarised yet" not in page.text


def _body(number: int, tenant: str, revision: str, action: str, at: str) -> Any:
    body = decision_entry_body(f"d-{number}", tenant)
    decision = body.decision.model_copy(
        update={"policy_revision": revision, "action": action, "evaluated_at": at}
    )
    return body.model_copy(update={"decision": decision})


def test_the_journal_keeps_summaries_that_a_rebuild_agrees_with(lanes_on_both: Lanes) -> None:
    journal = DecisionJournal(lanes_on_both)
    r1, r2 = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    try:
        journal.record(_body(1, "tenant-a", r1, "read", "2026-03-03T10:00:00.000Z"), status=200)
        journal.record(_body(2, "tenant-a", r1, "write", "2026-03-03T09:00:00.000Z"), status=403)
        journal.record(_body(3, "tenant-a", r2, "read", "2026-03-04T10:00:00.000Z"), status=200)
        journal.record(_body(4, "tenant-b", r2, "read", "2026-03-05T10:00:00.000Z"), status=200)
        unavailable = _body(5, "tenant-a", "unknown", "read", "2026-03-06T10:00:00.000Z")
        journal.record(unavailable, status=503)
        service_made = _body(6, "tenant-a", r2, "read", "2026-03-06T11:00:00.000Z")
        decision = service_made.decision.model_copy(
            update={"engine": DecisionEngine(name="sessionstate", version="1")}
        )
        journal.record(service_made.model_copy(update={"decision": decision}), status=429)
    finally:
        journal.close()
    kept = revisions.revisions(lanes_on_both, "tenant-a")
    assert [(s.policy_revision, s.decisions, s.by_action) for s in kept] == [
        (r1, 2, {"read": 1, "write": 1}),
        (r2, 1, {"read": 1}),
    ]
    assert (kept[0].first_decided_at, kept[0].last_decided_at) == (
        "2026-03-03T09:00:00.000Z",
        "2026-03-03T10:00:00.000Z",
    )
    assert [s.decisions for s in revisions.revisions(lanes_on_both, "tenant-b")] == [1]
    assert revisions.rebuild(lanes_on_both) == 3
    assert revisions.revisions(lanes_on_both, "tenant-a") == kept
    assert revisions.complete(lanes_on_both)
