"""Fork end to end: real HTTP, real OPA, real LevelDB (and PostgreSQL)."""

from __future__ import annotations

from typing import Any

from store.record.state_record import compute_state_digest
from tests.http.test_http_versions import STATE, body_of, entry, five_writes
from tests.support.live import LiveService

SOURCE = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1"
TARGET_STATE = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-2/state"


def write_target(service: LiveService) -> str:
    """A record of the target's own: the target exists. Its token, returned."""
    target = service.token(session="chat-2")
    answer = service.call("PUT", TARGET_STATE, target, json=body_of(9))
    assert answer.status_code == 201, answer.text
    return target


def workspace_token(service: LiveService) -> str:
    return service.token(sub="svc-ws", session=None)


def fork(
    service: LiveService,
    to: str = "chat-2",
    version: int | None = None,
    token: str | None = None,
    path: str = SOURCE,
) -> Any:
    body: dict[str, Any] = {"to_session_id": to}
    if version is not None:
        body["from_version"] = version
    return service.call("POST", f"{path}/fork", token or workspace_token(service), json=body)


def assert_forked_at_three(service: LiveService, written: list[dict[str, Any]]) -> None:
    answer = fork(service, version=3)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    record = body["record"]
    assert body["version"] == 1
    assert answer.headers["Location"] == TARGET_STATE
    assert answer.headers["ETag"] == f'"{record["state_digest"]}"'
    assert record["scope"]["session_id"] == "chat-2"
    assert record["lineage"] == {
        "forked_from": {
            "tenant_id": "tenant-a",
            "workspace_id": "ws-1",
            "session_id": "chat-1",
            "version": 3,
            "state_digest": written[2]["record"]["state_digest"],
        }
    }
    assert record["turns"] == written[2]["record"]["turns"]
    content = {key: value for key, value in record.items() if key != "state_digest"}
    assert record["state_digest"] == compute_state_digest(content)  # lineage is covered
    read = service.call("GET", TARGET_STATE, service.token(session="chat-2"))
    assert read.status_code == 200, read.text
    assert (read.json()["version"], read.json()["read_report"]["record"]) == (1, record)
    decision = body["decision"]
    assert decision["action"] == "fork" and decision["allow"] is True
    logged = entry(service, decision["decision_id"])
    assert logged["input"]["target"]["session_id"] == "chat-2"
    assert logged["input"]["fork"] == {
        "source_session_id": "chat-1",
        "source_version": 3,
        "source_state_digest": written[2]["record"]["state_digest"],
    }
    assert logged["outcome"]["status"] == 201 and logged["outcome"]["applied"] is True


def test_a_fork_at_version_3_of_five_carries_its_lineage(service: LiveService) -> None:
    written = five_writes(service)
    assert_forked_at_three(service, written)
    listed = service.call(
        "GET", "/v1/tenants/tenant-a/workspaces/ws-1/sessions", workspace_token(service)
    )
    lineage = {item["session_id"]: item["lineage"] for item in listed.json()["sessions"]}
    assert lineage["chat-1"] is None
    assert lineage["chat-2"]["forked_from"]["version"] == 3
    source = service.call("GET", STATE, service.token())
    assert "lineage" not in source.json()["read_report"]["record"]  # never forked: absent


def test_a_fork_on_postgresql(on_postgres: LiveService) -> None:
    assert_forked_at_three(on_postgres, five_writes(on_postgres))


def test_a_fork_of_the_current_version_by_the_tenant_s_operator(service: LiveService) -> None:
    written = five_writes(service)
    answer = fork(service, token=service.operator())
    assert answer.status_code == 201, answer.text
    forked_from = answer.json()["record"]["lineage"]["forked_from"]
    assert (forked_from["version"], forked_from["state_digest"]) == (
        5,
        written[4]["record"]["state_digest"],
    )


def test_a_target_that_exists_is_409_session_state_exists(service: LiveService) -> None:
    five_writes(service)
    write_target(service)
    answer = fork(service, version=3)
    assert answer.status_code == 409, answer.text
    assert answer.json()["reason"] == "session_state_exists"
    assert entry(service, answer.json()["decision"]["decision_id"])["outcome"]["status"] == 409
    again = fork(service, version=3)  # a fork done once is not done twice
    assert again.status_code == 409


def test_an_erased_target_counts_as_absent(service: LiveService) -> None:
    five_writes(service)
    target = write_target(service)
    erased = service.call("DELETE", TARGET_STATE, target)
    assert erased.status_code == 204, erased.text
    answer = fork(service, version=2)
    assert answer.status_code == 201, answer.text
    assert answer.json()["version"] == 1


def test_a_session_scoped_token_is_refused(service: LiveService) -> None:
    five_writes(service)
    answer = fork(service, token=service.token())
    assert answer.status_code == 403, answer.text
    assert "session_scoped_token_rejected" in answer.json()["decision"]["reasons"]
    assert service.call("GET", TARGET_STATE, service.token(session="chat-2")).status_code == 404


def test_a_cross_tenant_path_is_refused(service: LiveService) -> None:
    five_writes(service)
    path = "/v1/tenants/tenant-b/workspaces/ws-1/sessions/chat-1"
    answer = fork(service, path=path)
    assert answer.status_code == 403, answer.text
    assert "cross_tenant_scope_rejected" in answer.json()["decision"]["reasons"]


def test_without_an_approval_for_the_target_it_is_refused_like_a_write(
    service: LiveService,
) -> None:
    service.approve(session_id="chat-1")
    for n in range(1, 4):
        answer = service.call("PUT", STATE, service.token(), json=body_of(n))
        assert answer.status_code in (200, 201), answer.text
    answer = fork(service)
    assert answer.status_code == 403, answer.text
    body = answer.json()
    assert body["decision"]["reasons"] == ["session_state_operator_approval_missing"]
    assert body["write_report"]["applied"] is False
    service.approve(session_id="chat-2")
    assert fork(service).status_code == 201


def test_a_bad_to_session_id_is_400_and_never_normalised(service: LiveService) -> None:
    five_writes(service)
    for bad in ("Chat 2", " chat-2", "chat-2\n", "x" * 300, ""):
        answer = fork(service, to=bad)
        assert answer.status_code == 400, bad
        assert answer.json()["reason"] == "invalid_scope_id"
    assert service.call("GET", TARGET_STATE, service.token(session="chat-2")).status_code == 404


def test_a_source_that_is_not_there_is_404(service: LiveService) -> None:
    missing = fork(service)
    assert missing.status_code == 404, missing.text
    assert missing.json()["reason"] == "session_state_not_found"
    five_writes(service)
    not_kept = fork(service, version=9)
    assert not_kept.status_code == 404
    assert not_kept.json()["reason"] == "session_state_version_not_found"
    assert service.call("DELETE", STATE, service.token()).status_code == 204
    for version in (None, 2):
        erased = fork(service, version=version)
        assert erased.status_code == 404
        assert erased.json()["reason"] == "session_state_erased"


def test_a_later_write_of_the_target_keeps_its_lineage(service: LiveService) -> None:
    five_writes(service)
    forked = fork(service, version=3).json()["record"]
    target = service.token(session="chat-2")
    etag = {"If-Match": f'"{forked["state_digest"]}"'}
    written = service.call("PUT", TARGET_STATE, target, json=body_of(9), headers=etag)
    assert written.status_code == 200, written.text
    assert written.json()["version"] == 2
    assert written.json()["record"]["lineage"] == forked["lineage"]
    listed = service.call(
        "GET", "/v1/tenants/tenant-a/workspaces/ws-1/sessions", workspace_token(service)
    )
    lineage = {item["session_id"]: item["lineage"] for item in listed.json()["sessions"]}
    assert lineage["chat-2"] == forked["lineage"]
    erased = service.call("DELETE", TARGET_STATE, target)
    assert erased.status_code == 204
    again = service.call("PUT", TARGET_STATE, target, json=body_of(10))
    assert again.status_code == 201, again.text
    assert "lineage" not in again.json()["record"]  # erased: a new session, never forked
