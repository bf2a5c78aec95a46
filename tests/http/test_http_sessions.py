"""The session lifecycle end to end: a workspace's list, a session's erasure with its receipt,
a workspace's erasure. Real HTTP, real OPA, real LevelDB (and PostgreSQL for the erasure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from store.key_codec import TenantResourceLane
from tests.support.factories import state_input
from tests.support.live import LiveService

SESSIONS = "/v1/tenants/{t}/workspaces/{w}/sessions"
ANCHOR = "memory:only-in-the-erased-record-5f1c9e"


def sessions_path(t: str = "tenant-a", w: str = "ws-1") -> str:
    return SESSIONS.format(t=t, w=w)


def workspace_token(service: LiveService, tenant: str = "tenant-a") -> str:
    return service.token(tenant=tenant, session=None)


def auditor(service: LiveService) -> str:
    return service.token("auditor", sub="au-1", workspace=None, session=None)


def write(service: LiveService, session: str, **overrides: Any) -> str:
    """Write a record of session (an approval covering the workspace in force); its digest."""
    answer = service.call(
        "PUT",
        service.session_path(s=session) + "/state",
        service.token(session=session),
        json=state_input(**overrides),
    )
    assert answer.status_code in (200, 201), answer.text
    digest: str = answer.json()["record"]["state_digest"]
    return digest


def erase(service: LiveService, session: str = "chat-1", **headers: str) -> Any:
    path = service.session_path(s=session) + "/state"
    return service.call("DELETE", path, service.token(session=session), headers=headers)


def read(service: LiveService, session: str = "chat-1") -> Any:
    return service.call(
        "GET", service.session_path(s=session) + "/state", service.token(session=session)
    )


def versions(service: LiveService, session: str = "chat-1") -> Any:
    return service.call(
        "GET", service.session_path(s=session) + "/state/versions", service.token(session=session)
    )


def entry(service: LiveService, decision_id: str) -> dict[str, Any]:
    answer = service.call("GET", f"/v1/decisions/{decision_id}", auditor(service))
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()["entry"]
    return found


def data_dir_holds(service: LiveService, needle: str) -> list[Path]:
    """Every file under the data dir, read as bytes, that holds needle."""
    files = (path for path in service.settings.data_dir.rglob("*") if path.is_file())
    return [path for path in files if needle.encode() in path.read_bytes()]


@pytest.fixture
def written(service: LiveService) -> LiveService:
    """Three sessions of ws-1 written, and one of ws-2 that no list of ws-1 may show."""
    service.approve()
    for session in ("chat-1", "chat-2", "chat-3"):
        write(service, session)
    approval = {"ttl_seconds": 600, "reason": "tests"}
    ws2 = "/v1/tenants/tenant-a/workspaces/ws-2"
    assert service.call("POST", ws2 + "/approvals", service.operator(), json=approval).ok
    answer = service.call(
        "PUT",
        ws2 + "/sessions/chat-9/state",
        service.token(workspace="ws-2", session="chat-9"),
        json=state_input(),
    )
    assert answer.status_code == 201, answer.text
    return service


# --- list --------------------------------------------------------------------------------


def test_a_workspace_token_lists_its_sessions_a_page_at_a_time(written: LiveService) -> None:
    first = written.call("GET", sessions_path() + "?limit=2", workspace_token(written))
    assert first.status_code == 200, first.text
    body = first.json()
    assert [item["session_id"] for item in body["sessions"]] == ["chat-1", "chat-2"]
    assert body["decision"]["action"] == "list"
    assert body["decision"]["policy"] == "sessionstate/list"
    item = body["sessions"][0]
    assert set(item) == {
        "session_id", "version", "state_digest", "updated_at", "expires_at", "lineage",
    }  # fmt: skip
    assert item["state_digest"] == read(written).json()["read_report"]["record"]["state_digest"]
    assert item["updated_at"] is not None
    assert (item["version"], item["expires_at"], item["lineage"]) == (1, None, None)
    assert body["next_cursor"] is not None
    rest = written.call(
        "GET", sessions_path() + f"?limit=2&cursor={body['next_cursor']}", workspace_token(written)
    ).json()
    assert [item["session_id"] for item in rest["sessions"]] == ["chat-3"]
    assert rest["next_cursor"] is None


def paged(service: LiveService, limit: int) -> list[str]:
    """Every session of ws-1 as the list pages it, `limit` a page."""
    seen: list[str] = []
    cursor = ""
    while True:
        answer = service.call(
            "GET", sessions_path() + f"?limit={limit}{cursor}", workspace_token(service)
        )
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page["sessions"]) <= limit
        seen += [item["session_id"] for item in page["sessions"]]
        if page["next_cursor"] is None:
            return seen
        cursor = f"&cursor={page['next_cursor']}"


def test_the_list_is_in_session_id_order_whatever_the_ids_lengths(written: LiveService) -> None:
    for session in ("chat-10", "chat-20", "c", "chat-100"):
        write(written, session)
    assert paged(written, 2) == [
        "c",
        "chat-1",
        "chat-10",
        "chat-100",
        "chat-2",
        "chat-20",
        "chat-3",
    ]


def test_the_list_shows_only_the_workspace(written: LiveService) -> None:
    other = written.call("GET", sessions_path(w="ws-2"), written.operator()).json()
    assert [item["session_id"] for item in other["sessions"]] == ["chat-9"]
    mine = written.call("GET", sessions_path(), written.operator()).json()
    assert [item["session_id"] for item in mine["sessions"]] == ["chat-1", "chat-2", "chat-3"]


def test_a_session_token_may_not_list(written: LiveService) -> None:
    answer = written.call("GET", sessions_path(), written.token())
    assert answer.status_code == 403
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert answer.json()["reason"] == "cross_session_scope_rejected"


def test_another_tenants_workspace_is_refused(written: LiveService) -> None:
    listed = written.call("GET", sessions_path(t="tenant-b"), workspace_token(written))
    assert listed.status_code == 403
    assert listed.json()["reason"] == "cross_tenant_scope_rejected"
    erased = written.call("DELETE", written.session_path(t="tenant-b") + "/state", written.token())
    assert erased.status_code == 403
    assert erased.json()["reason"] == "cross_tenant_scope_rejected"
    assert read(written).status_code == 200


def test_a_cursor_not_issued_by_the_service_is_refused(written: LiveService) -> None:
    answer = written.call("GET", sessions_path() + "?cursor=bm90LW91cnM", workspace_token(written))
    assert answer.status_code == 422
    body = answer.json()
    assert body["reason"] == "validation_failed"
    assert body["errors"] == [{"loc": ["query", "cursor"], "rule": "invalid_cursor"}]
    assert "bm90LW91cnM" not in answer.text


# --- erasure -----------------------------------------------------------------------------


def test_an_erasure_answers_204_and_the_read_names_its_receipt(written: LiveService) -> None:
    digest = read(written).json()["read_report"]["record"]["state_digest"]
    answer = erase(written)
    assert answer.status_code == 204, answer.text
    decision_id = answer.headers["Sessionstate-Decision-Id"]
    gone = read(written)
    assert gone.status_code == 404
    body = gone.json()
    assert body["reason"] == "session_state_erased"
    assert body["erasure_decision_id"] == decision_id
    assert body["erasure_reason"] == "requested"
    receipt = entry(written, decision_id)
    assert body["erased_at"] == receipt["recorded_at"]
    assert receipt["decision"]["action"] == "erase"
    assert receipt["decision"]["policy"] == "sessionstate/erase"
    assert receipt["actor"]["sub"] == "svc-1"
    assert receipt["outcome"] == {"status": 204, "applied": True, "approval_id": None}
    assert receipt["input"]["erasure"] == {
        "reason": "requested",
        "versions": 1,
        "state_digest": digest,
        "workspace_decision_id": None,
    }
    verified = written.call("GET", "/v1/decisions/verify", auditor(written)).json()
    assert verified["ok"] is True
    listed = written.call("GET", sessions_path(), written.operator()).json()
    assert [item["session_id"] for item in listed["sessions"]] == ["chat-2", "chat-3"]


def test_the_erased_bytes_are_gone_from_every_file_of_the_data_dir(service: LiveService) -> None:
    service.approve()
    write(service, "chat-1", memory_anchors=[{"anchor_id": ANCHOR, "evidence": "x"}])
    write(service, "chat-1")  # the anchor is now held by version 1 alone, not the record
    assert versions(service).json()["versions"][-1]["version"] == 1
    assert data_dir_holds(service, ANCHOR)  # the version's bytes are on disk, somewhere
    assert erase(service).status_code == 204
    assert data_dir_holds(service, ANCHOR) == []


def test_an_erasure_takes_every_version_and_the_next_write_is_version_1(
    service: LiveService,
) -> None:
    service.approve()
    for n in range(1, 6):
        write(service, "chat-1", turns=[{"turn_id": f"t-{n}", "role": "user", "payload": f"{n}"}])
    assert read(service).json()["version"] == 5
    listed = service.call("GET", sessions_path(), service.operator()).json()["sessions"]
    assert [(item["session_id"], item["version"]) for item in listed] == [("chat-1", 5)]
    etag = read(service).headers["ETag"]
    answer = erase(service)
    assert answer.status_code == 204
    decision_id = answer.headers["Sessionstate-Decision-Id"]
    assert entry(service, decision_id)["input"]["erasure"]["versions"] == 5
    rewind = service.call(
        "POST",
        service.session_path() + "/state/rewind",
        service.token(),
        headers={"If-Match": etag},
        json={"to_version": 2},
    )
    for gone in (
        versions(service),
        service.call("GET", service.session_path() + "/state/versions/2", service.token()),
        rewind,
    ):
        assert gone.status_code == 404, gone.text
        assert gone.json()["reason"] == "session_state_erased"
        assert gone.json()["erasure_decision_id"] == decision_id
    assert service.context.lanes.count(TenantResourceLane.SESSION_VERSION) == 0
    again = service.call(
        "PUT", service.session_path() + "/state", service.token(), json=state_input()
    )
    assert again.status_code == 201, again.text
    assert again.json()["version"] == 1
    assert [item["version"] for item in versions(service).json()["versions"]] == [1]
    listed = service.call("GET", sessions_path(), service.operator()).json()["sessions"]
    assert [(item["session_id"], item["version"]) for item in listed] == [("chat-1", 1)]


def test_an_operator_erases_any_session_of_its_tenant(written: LiveService) -> None:
    path = written.session_path(s="chat-2") + "/state"
    assert written.call("DELETE", path, written.operator()).status_code == 204
    assert read(written, "chat-2").json()["reason"] == "session_state_erased"


def test_a_token_of_another_session_may_not_erase(written: LiveService) -> None:
    path = written.session_path(s="chat-2") + "/state"
    answer = written.call("DELETE", path, written.token(session="chat-1"))
    assert answer.status_code == 403
    assert answer.json()["reason"] == "cross_session_scope_rejected"
    assert read(written, "chat-2").status_code == 200


def test_an_if_match_of_another_version_is_412_and_erases_nothing(written: LiveService) -> None:
    answer = erase(written, **{"If-Match": '"sha256:' + "0" * 64 + '"'})
    assert answer.status_code == 412
    assert answer.json()["reason"] == "precondition_failed"
    assert entry(written, answer.json()["decision"]["decision_id"])["outcome"]["status"] == 412
    assert read(written).status_code == 200
    current = read(written).headers["ETag"]
    assert erase(written, **{"If-Match": current}).status_code == 204


def test_erasing_nothing_stored_is_204_and_its_entry_says_nothing_was_applied(
    written: LiveService,
) -> None:
    answer = erase(written, "never-written")
    assert answer.status_code == 204
    receipt = entry(written, answer.headers["Sessionstate-Decision-Id"])
    assert receipt["outcome"]["applied"] is False
    assert receipt["input"]["erasure"]["versions"] == 0
    assert receipt["input"]["erasure"]["state_digest"] is None
    assert read(written, "never-written").json()["reason"] == "session_state_not_found"
    # Erasing twice keeps the first erasure's tombstone.
    first = erase(written).headers["Sessionstate-Decision-Id"]
    assert erase(written).status_code == 204
    assert read(written).json()["erasure_decision_id"] == first


def test_erasing_needs_no_durable_writes_or_approval(default_service: LiveService) -> None:
    answer = erase(default_service)
    assert answer.status_code == 204, answer.text


def test_a_write_after_an_erasure_starts_the_session_again(written: LiveService) -> None:
    assert erase(written).status_code == 204
    write(written, "chat-1")
    assert read(written).status_code == 200


# --- a workspace's erasure ---------------------------------------------------------------


def test_an_operator_erases_a_workspace_with_a_receipt_per_session(written: LiveService) -> None:
    answer = written.call("DELETE", sessions_path(), written.operator())
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["sessions_erased"], body["complete"]) == (3, True)
    workspace_decision = body["decision"]["decision_id"]
    for session in ("chat-1", "chat-2", "chat-3"):
        gone = read(written, session).json()
        assert gone["reason"] == "session_state_erased"
        receipt = entry(written, gone["erasure_decision_id"])
        assert receipt["input"]["erasure"]["workspace_decision_id"] == workspace_decision
        assert receipt["actor"]["sub"] == "op-1"
    assert written.call("GET", sessions_path(), written.operator()).json()["sessions"] == []
    assert written.call("GET", sessions_path(w="ws-2"), written.operator()).json()["sessions"]
    assert written.context.lanes.count(TenantResourceLane.SESSION_VERSION) == 1  # ws-2's chat-9
    again = written.call("DELETE", sessions_path(), written.operator()).json()
    assert (again["sessions_erased"], again["complete"]) == (0, True)


def test_a_model_service_may_not_erase_a_workspace(written: LiveService) -> None:
    answer = written.call("DELETE", sessions_path(), workspace_token(written))
    assert answer.status_code == 403
    assert answer.json()["reason"] == "role_not_permitted"
    assert read(written).status_code == 200


# --- on PostgreSQL -----------------------------------------------------------------------


def test_the_list_pages_in_session_id_order_on_postgresql(on_postgres: LiveService) -> None:
    on_postgres.approve()
    for session in ("chat-2", "chat-10", "c", "chat-1"):
        write(on_postgres, session)
    assert paged(on_postgres, 3) == ["c", "chat-1", "chat-10", "chat-2"]
    assert paged(on_postgres, 1) == ["c", "chat-1", "chat-10", "chat-2"]


def test_the_erasure_on_postgresql(on_postgres: LiveService) -> None:
    on_postgres.approve()
    for session in ("chat-1", "chat-2"):
        write(on_postgres, session)
    answer = erase(on_postgres)
    assert answer.status_code == 204, answer.text
    gone = read(on_postgres).json()
    assert gone["reason"] == "session_state_erased"
    assert gone["erasure_decision_id"] == answer.headers["Sessionstate-Decision-Id"]
    listed = on_postgres.call("GET", sessions_path(), on_postgres.operator()).json()
    assert [item["session_id"] for item in listed["sessions"]] == ["chat-2"]
    stale = erase(on_postgres, "chat-2", **{"If-Match": '"sha256:' + "0" * 64 + '"'})
    assert stale.status_code == 412
    workspace = on_postgres.call("DELETE", sessions_path(), on_postgres.operator()).json()
    assert (workspace["sessions_erased"], workspace["complete"]) == (1, True)
    assert read(on_postgres, "chat-2").json()["reason"] == "session_state_erased"
    assert versions(on_postgres).json()["reason"] == "session_state_erased"
    assert on_postgres.context.lanes.count(TenantResourceLane.SESSION_VERSION) == 0
    write(on_postgres, "chat-1")
    assert read(on_postgres).json()["version"] == 1
    verified = on_postgres.call("GET", "/v1/decisions/verify", auditor(on_postgres)).json()
    assert verified["ok"] is True
