"""Versions and rewind end to end: real HTTP, real OPA, real LevelDB (and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.policy.sidecar import OpaSidecar
from store.key_codec import LaneKey, TenantResourceLane
from store.session_state import state_key
from store.version_lane import LANE
from tests.support.factories import scope, state_input
from tests.support.live import LiveService, live_service, service_settings

STATE = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1/state"


@pytest.fixture(params=["leveldb", "postgresql"])
def on_both(
    request: pytest.FixtureRequest, sidecar: OpaSidecar, tmp_path: Path
) -> Iterator[LiveService]:
    """The service with durable writes on, on each backend."""
    store = (
        {}
        if request.param == "leveldb"
        else {"store": request.getfixturevalue("postgres_conninfo")}
    )
    with live_service(sidecar, service_settings(tmp_path / "var", **store)) as live:
        yield live


@pytest.fixture
def keeping_three(sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    settings = service_settings(tmp_path / "var", state_versions_kept=3)
    with live_service(sidecar, settings) as live:
        yield live


def body_of(n: int) -> dict[str, Any]:
    """A write whose record is the n-th of the session: its turns differ from every other's."""
    turns = [{"turn_id": f"turn-{n}", "role": "user", "payload": f"message number {n}"}]
    return state_input(turns=turns)


def write(service: LiveService, n: int, token: str | None = None) -> dict[str, Any]:
    answer = service.call("PUT", STATE, token or service.token(), json=body_of(n))
    assert answer.status_code in (200, 201), answer.text
    body: dict[str, Any] = answer.json()
    assert answer.headers["ETag"] == f'"{body["record"]["state_digest"]}"'
    return body


def five_writes(service: LiveService) -> list[dict[str, Any]]:
    service.approve()
    return [write(service, n) for n in range(1, 6)]


def versions(service: LiveService, query: str = "", token: str | None = None) -> Any:
    return service.call("GET", f"{STATE}/versions{query}", token or service.token())


def rewind(service: LiveService, to: int, if_match: str | None, token: str | None = None) -> Any:
    headers = {} if if_match is None else {"If-Match": f'"{if_match}"'}
    return service.call(
        "POST",
        f"{STATE}/rewind",
        token or service.token(),
        json={"to_version": to},
        headers=headers,
    )


def entry(service: LiveService, decision_id: str) -> dict[str, Any]:
    auditor = service.token("auditor", sub="au-1", workspace=None, session=None)
    answer = service.call("GET", f"/v1/decisions/{decision_id}", auditor)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()["entry"]
    return found


# --- the list and one version ------------------------------------------------------------


def test_five_writes_are_five_versions_newest_first_and_an_old_one_reads(
    on_both: LiveService,
) -> None:
    written = five_writes(on_both)
    assert [body["version"] for body in written] == [1, 2, 3, 4, 5]
    answer = versions(on_both)
    assert answer.status_code == 200, answer.text
    listed = answer.json()
    assert listed["decision"]["action"] == "history" and listed["decision"]["allow"] is True
    assert listed["next_cursor"] is None
    assert [v["version"] for v in listed["versions"]] == [5, 4, 3, 2, 1]
    for version, body in zip(reversed(listed["versions"]), written, strict=True):
        assert version["state_digest"] == body["record"]["state_digest"]
        assert version["decision_id"] == body["decision"]["decision_id"]
        assert version["written_at"].endswith("Z")
    old = on_both.call("GET", f"{STATE}/versions/2", on_both.token())
    assert old.status_code == 200, old.text
    assert old.json()["version"] == 2
    assert old.json()["read_report"]["record"] == written[1]["record"]
    assert old.headers["ETag"] == f'"{written[1]["record"]["state_digest"]}"'
    current = on_both.call("GET", STATE, on_both.token())
    assert current.json()["version"] == 5
    assert current.headers["ETag"] == f'"{written[4]["record"]["state_digest"]}"'


def test_the_versions_kept_are_bounded_and_older_ones_are_gone_from_the_store(
    keeping_three: LiveService,
) -> None:
    written = five_writes(keeping_three)
    listed = versions(keeping_three).json()["versions"]
    assert [v["version"] for v in listed] == [5, 4, 3]
    gone = keeping_three.call("GET", f"{STATE}/versions/2", keeping_three.token())
    assert gone.status_code == 404
    assert gone.json()["reason"] == "session_state_version_not_found"
    assert gone.json()["decision"]["action"] == "history"
    assert keeping_three.context.lanes.count(LANE) == 3
    assert listed[0]["state_digest"] == written[4]["record"]["state_digest"]


def test_paging_follows_cursors_to_the_end(service: LiveService) -> None:
    five_writes(service)
    seen: list[int] = []
    query = "?limit=2"
    while True:
        page = versions(service, query).json()
        seen += [v["version"] for v in page["versions"]]
        if page["next_cursor"] is None:
            break
        query = f"?limit=2&cursor={page['next_cursor']}"
    assert seen == [5, 4, 3, 2, 1]


@pytest.mark.parametrize("query", ["?limit=0", "?limit=101", "?cursor=bm9wZQ", "?colour=red"])
def test_bad_queries_are_422_naming_the_parameter(service: LiveService, query: str) -> None:
    five_writes(service)
    answer = versions(service, query)
    assert answer.status_code == 422
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert answer.json()["reason"] == "validation_failed"
    assert answer.json()["errors"][0]["loc"][0] == "query"


def test_a_decisions_cursor_is_no_versions_cursor(service: LiveService) -> None:
    five_writes(service)
    auditor = service.token("auditor", sub="au-1", workspace=None, session=None)
    cursor = service.call("GET", "/v1/decisions?limit=1", auditor).json()["next_cursor"]
    answer = versions(service, f"?cursor={cursor}")
    assert answer.status_code == 422
    assert answer.json()["errors"] == [{"loc": ["query", "cursor"], "rule": "invalid_cursor"}]


def test_unknown_and_malformed_versions(service: LiveService) -> None:
    assert versions(service).json()["reason"] == "session_state_not_found"
    five_writes(service)
    unknown = service.call("GET", f"{STATE}/versions/6", service.token())
    assert (unknown.status_code, unknown.json()["reason"]) == (
        404,
        "session_state_version_not_found",
    )
    last = service.call("GET", f"{STATE}/versions/9007199254740991", service.token())
    assert (last.status_code, last.json()["reason"]) == (404, "session_state_version_not_found")
    for malformed in ("0", "abc", "-1", "9007199254740992", "9999999999999999", "1" + "0" * 16):
        answer = service.call("GET", f"{STATE}/versions/{malformed}", service.token())
        assert (answer.status_code, answer.json()["reason"]) == (400, "invalid_version")


def test_a_record_from_before_versions_is_version_1(service: LiveService) -> None:
    service.approve()
    first = write(service, 1)
    lanes = service.context.lanes
    for key, _ in list(lanes.scan(LANE)):  # as a store of an older release holds it
        lanes.delete(key)
    assert service.call("GET", STATE, service.token()).json()["version"] == 1
    listed = versions(service).json()["versions"]
    assert listed == [
        {
            "version": 1,
            "state_digest": first["record"]["state_digest"],
            "written_at": None,
            "decision_id": None,
        }
    ]
    legacy = service.call("GET", f"{STATE}/versions/1", service.token())
    assert legacy.json()["read_report"]["record"] == first["record"]
    assert write(service, 2)["version"] == 2
    listed = versions(service).json()["versions"]
    assert [(v["version"], v["decision_id"] is None) for v in listed] == [(2, False), (1, True)]
    assert listed[1]["state_digest"] == first["record"]["state_digest"]
    assert lanes.get(state_key(scope("tenant-a"))) is not None


# --- rewind ------------------------------------------------------------------------------


def test_rewind_needs_if_match_and_the_current_one(on_both: LiveService) -> None:
    written = five_writes(on_both)
    current = written[4]["record"]["state_digest"]
    missing = rewind(on_both, 2, None)
    assert (missing.status_code, missing.json()["reason"]) == (428, "precondition_required")
    stale = rewind(on_both, 2, written[3]["record"]["state_digest"])
    assert stale.status_code == 412, stale.text
    assert stale.json()["reason"] == "precondition_failed"
    assert entry(on_both, stale.json()["decision"]["decision_id"])["outcome"]["applied"] is False
    done = rewind(on_both, 2, current)
    assert done.status_code == 200, done.text
    body = done.json()
    restored = written[1]["record"]["state_digest"]
    assert body["version"] == 6
    assert body["record"]["state_digest"] == restored
    assert done.headers["ETag"] == f'"{restored}"'
    assert body["decision"]["action"] == "rewind" and body["write_report"]["applied"] is True
    kept = entry(on_both, body["decision"]["decision_id"])
    assert kept["input"]["rewind"] == {"restored_version": 2, "replaced_version": 5}
    assert kept["outcome"] == {"status": 200, "applied": True, "approval_id": None}
    now = on_both.call("GET", STATE, on_both.token())
    assert now.json()["version"] == 6 and now.headers["ETag"] == f'"{restored}"'
    newest = versions(on_both).json()["versions"][0]
    assert newest["version"] == 6 and newest["state_digest"] == restored
    assert newest["decision_id"] == body["decision"]["decision_id"]


def test_rewind_to_what_is_not_there(service: LiveService) -> None:
    nothing = rewind(service, 1, "sha256:" + "0" * 64)
    assert (nothing.status_code, nothing.json()["reason"]) == (404, "session_state_not_found")
    written = five_writes(service)
    unknown = rewind(service, 9, written[4]["record"]["state_digest"])
    assert (unknown.status_code, unknown.json()["reason"]) == (
        404,
        "session_state_version_not_found",
    )
    assert unknown.json()["decision"]["action"] == "history"
    malformed = service.call(
        "POST",
        f"{STATE}/rewind",
        service.token(),
        json={"to_version": "2"},
        headers={"If-Match": '"x"'},
    )
    assert (malformed.status_code, malformed.json()["reason"]) == (400, "invalid_precondition")


def test_a_corrupt_version_is_not_restored(service: LiveService) -> None:
    written = five_writes(service)
    key = LaneKey(LANE, "tenant-a", "ws-1", "chat-1", (3).to_bytes(8, "big"))
    service.context.lanes.put(key, b"{not json")
    read = service.call("GET", f"{STATE}/versions/3", service.token()).json()
    assert read["read_report"]["corrupt"] is True and read["read_report"]["record"] is None
    refused = rewind(service, 3, written[4]["record"]["state_digest"])
    assert (refused.status_code, refused.json()["reason"]) == (409, "session_state_version_corrupt")
    assert service.call("GET", STATE, service.token()).json()["version"] == 5


def test_rewind_is_a_write_and_needs_an_approval_in_force(service: LiveService) -> None:
    approval = service.approve()
    written = [write(service, n) for n in (1, 2)]
    revoked = service.call(
        "DELETE",
        f"/v1/tenants/tenant-a/workspaces/ws-1/approvals/{approval['approval_id']}",
        service.operator(),
    )
    assert revoked.status_code == 204
    refused = rewind(service, 1, written[1]["record"]["state_digest"])
    assert refused.status_code == 403
    assert refused.json()["reason"] == "session_state_operator_approval_missing"
    assert refused.json()["decision"]["action"] == "rewind"
    assert refused.json()["write_report"]["applied"] is False
    assert service.call("GET", STATE, service.token()).json()["version"] == 2


# --- who may ------------------------------------------------------------------------------


def test_another_session_s_token_and_another_tenant_s_path_are_refused(
    service: LiveService,
) -> None:
    written = five_writes(service)
    other = service.token(session="chat-2")
    digest = written[4]["record"]["state_digest"]
    for answer in (
        versions(service, token=other),
        service.call("GET", f"{STATE}/versions/1", other),
        rewind(service, 1, digest, token=other),
    ):
        assert answer.status_code == 403, answer.text
        assert answer.json()["reason"] in {
            "cross_session_scope_rejected",
            "session_state_cross_session_write_rejected",
        }
    foreign = STATE.replace("tenant-a", "tenant-b")
    for method, path, body in (
        ("GET", foreign + "/versions", None),
        ("GET", foreign + "/versions/1", None),
        ("POST", foreign + "/rewind", {"to_version": 1}),
    ):
        answer = service.call(
            method, path, service.token(), json=body, headers={"If-Match": f'"{digest}"'}
        )
        assert answer.status_code == 403, answer.text
        assert answer.json()["reason"] in {
            "cross_tenant_scope_rejected",
            "session_state_cross_tenant_write_rejected",
        }
    assert service.call("GET", STATE, service.token()).json()["version"] == 5
    assert service.context.lanes.count(TenantResourceLane.SESSION_VERSION) == 5
