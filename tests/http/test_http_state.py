"""The state endpoints end to end: real HTTP, real OPA, real LevelDB."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import pytest

from store.key_codec import LaneKey, TenantResourceLane
from tests.support.factories import state_input
from tests.support.live import LiveService

JSON = {"Content-Type": "application/json"}


def assert_decision(body: dict[str, Any], action: str, allow: bool) -> dict[str, Any]:
    decision: dict[str, Any] = body["decision"]
    assert decision["action"] == action
    assert decision["allow"] is allow
    assert decision["engine"]["name"] == "opa"
    assert decision["policy_revision"].startswith("sha256:")
    assert decision["input_digest"].startswith("sha256:")
    return decision


def put_state(service: LiveService, body: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    return service.call(
        "PUT",
        service.session_path() + "/state",
        service.token(),
        json=body or state_input(),
        **kwargs,
    )


# --- preview -----------------------------------------------------------------------------


def test_preview_returns_the_sanitized_record_and_never_writes(service: LiveService) -> None:
    answer = service.call(
        "POST", service.session_path() + "/state/preview", service.token(), json=state_input()
    )
    assert answer.status_code == 200
    body = answer.json()
    record = body["record"]
    assert record["scope"] == {
        "tenant_id": "tenant-a",
        "workspace_id": "ws-1",
        "session_id": "chat-1",
    }
    assert record["turns"][0]["payload_digest"].startswith("hmac-sha256:")
    assert (record["raw_messages_stored"], record["write_allowed"]) == (False, False)
    report = body["write_report"]
    assert report["applied"] is False
    assert report["durable_write_requested"] is False
    assert report["preview_only"] is True
    assert report["blocked_reasons"] == ["session_state_operator_approval_missing"]
    assert_decision(body, "preview", True)
    assert (
        service.call("GET", service.session_path() + "/state", service.token()).status_code == 404
    )


def test_preview_lists_validation_blockers(service: LiveService) -> None:
    service.approve()
    answer = service.call(
        "POST",
        service.session_path() + "/state/preview",
        service.token(),
        json=state_input(gene_anchors=[]),
    )
    assert answer.status_code == 200
    assert answer.json()["write_report"]["blocked_reasons"] == ["session_state_gene_anchor_missing"]


# --- write -------------------------------------------------------------------------------


def test_default_writes_are_preview_only(default_service: LiveService) -> None:
    default_service.approve()
    answer = put_state(default_service)
    assert answer.status_code == 403
    assert answer.headers["Content-Type"] == "application/problem+json"
    body = answer.json()
    assert body["reason"] == "session_state_durable_writes_disabled"
    assert body["write_report"]["applied"] is False
    assert body["write_report"]["durable_write_requested"] is True
    assert body["write_report"]["blocked_reasons"] == ["session_state_durable_writes_disabled"]
    assert assert_decision(body, "write", False)["reasons"] == [
        "session_state_durable_writes_disabled"
    ]
    assert (
        default_service.call(
            "GET", default_service.session_path() + "/state", default_service.token()
        ).status_code
        == 404
    )


def test_write_needs_an_operator_approval(service: LiveService) -> None:
    answer = put_state(service)
    assert answer.status_code == 403
    assert answer.json()["reason"] == "session_state_operator_approval_missing"


def test_approved_write_creates_then_replaces(service: LiveService) -> None:
    service.approve()
    created = put_state(service)
    assert created.status_code == 201, created.text
    body = created.json()
    digest = body["record"]["state_digest"]
    assert created.headers["ETag"] == f'"{digest}"'
    assert body["write_report"] == {
        "applied": True,
        "durable_write_requested": True,
        "key_digest": body["write_report"]["key_digest"],
        "blocked_reasons": [],
        "read_only": True,
        "report_only": True,
        "preview_only": False,
    }
    assert_decision(body, "write", True)
    replaced = put_state(service, state_input(source_trace_ids=["trace:two"]))
    assert replaced.status_code == 200
    read = service.call("GET", service.session_path() + "/state", service.token())
    assert read.status_code == 200
    assert read.headers["ETag"] == f'"{replaced.json()["record"]["state_digest"]}"'
    assert read.json()["read_report"]["record"] == replaced.json()["record"]
    assert_decision(read.json(), "read", True)


def test_session_approval_and_revocation(service: LiveService) -> None:
    approval = service.approve(session_id="chat-1")
    assert put_state(service).status_code == 201
    revoked = service.call(
        "DELETE",
        f"/v1/tenants/tenant-a/workspaces/ws-1/approvals/{approval['approval_id']}",
        service.operator(),
    )
    assert revoked.status_code == 204
    assert revoked.headers["Sessionstate-Decision-Id"]
    again = put_state(service)
    assert again.status_code == 403
    assert again.json()["reason"] == "session_state_operator_approval_missing"


def test_approval_for_another_session_does_not_count(service: LiveService) -> None:
    service.approve(session_id="chat-2")
    assert put_state(service).json()["reason"] == "session_state_operator_approval_missing"


def test_missing_anchors_block_the_write(service: LiveService) -> None:
    service.approve()
    answer = put_state(service, state_input(memory_anchors=[]))
    assert answer.status_code == 403
    assert answer.json()["reason"] == "session_state_memory_anchor_missing"


def test_if_none_match_creates_only(service: LiveService) -> None:
    service.approve()
    assert put_state(service, headers={"If-None-Match": "*"}).status_code == 201
    again = put_state(service, headers={"If-None-Match": "*"})
    assert again.status_code == 412
    body = again.json()
    assert body["reason"] == "precondition_failed"
    assert body["write_report"]["applied"] is False
    assert_decision(body, "write", True)


def test_if_match_replaces_only_that_version(service: LiveService) -> None:
    service.approve()
    first = put_state(service).headers["ETag"]
    stale = '"sha256:' + "0" * 64 + '"'
    assert (
        put_state(service, state_input(state_id="s2"), headers={"If-Match": stale}).status_code
        == 412
    )
    assert (
        put_state(service, state_input(state_id="s2"), headers={"If-Match": first}).status_code
        == 200
    )
    assert (
        put_state(service, state_input(state_id="s3"), headers={"If-Match": first}).status_code
        == 412
    )


@pytest.mark.parametrize(
    "headers",
    [
        {"If-Match": "sha256:" + "0" * 64},
        {"If-Match": '"nope"'},
        {"If-None-Match": '"x"'},
        {"If-Match": "*", "If-None-Match": "*"},
    ],
)
def test_malformed_preconditions_are_400(service: LiveService, headers: dict[str, str]) -> None:
    answer = put_state(service, headers=headers)
    assert answer.status_code == 400
    assert answer.json()["reason"] == "invalid_precondition"


def test_concurrent_writers_with_if_match_lose_no_update(service: LiveService) -> None:
    service.approve()
    start = state_input(turns=[])
    put_state(service, start)
    writers, rounds = 8, 4
    errors: list[str] = []

    def writer(n: int) -> None:
        for r in range(rounds):
            while True:
                current = service.call("GET", service.session_path() + "/state", service.token())
                record = current.json()["read_report"]["record"]
                turns = [
                    {k: t[k] for k in ("turn_id", "role", "payload_digest", "token_estimate")}
                    for t in record["turns"]
                ]
                turns.append({"turn_id": f"w{n}-r{r}", "role": "user", "payload": f"{n}:{r}"})
                answer = put_state(
                    service, state_input(turns=turns), headers={"If-Match": current.headers["ETag"]}
                )
                if answer.status_code == 412:
                    continue
                if answer.status_code != 200:
                    errors.append(answer.text)
                break

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    final = service.call("GET", service.session_path() + "/state", service.token()).json()
    turn_ids = {t["turn_id"] for t in final["read_report"]["record"]["turns"]}
    assert turn_ids == {f"w{n}-r{r}" for n in range(writers) for r in range(rounds)}


# --- scope isolation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token_scope", "reason"),
    [
        ({"tenant": "tenant-b"}, "session_state_cross_tenant_write_rejected"),
        ({"session": "chat-2"}, "session_state_cross_session_write_rejected"),
        ({"workspace": "ws-2"}, "session_state_cross_session_write_rejected"),
        ({"tenant": "Tenant-A"}, "session_state_cross_tenant_write_rejected"),
    ],
)
def test_cross_scope_writes_are_rejected(
    service: LiveService, token_scope: dict[str, str], reason: str
) -> None:
    service.approve()
    answer = service.call(
        "PUT", service.session_path() + "/state", service.token(**token_scope), json=state_input()
    )
    assert answer.status_code == 403
    assert answer.json()["reason"] == reason
    assert answer.json()["write_report"]["applied"] is False


@pytest.mark.parametrize(
    ("token_scope", "read_reason", "replay_reason"),
    [
        (
            {"tenant": "tenant-b"},
            "cross_tenant_scope_rejected",
            "session_replay_cross_tenant_rejected",
        ),
        (
            {"session": "chat-2"},
            "cross_session_scope_rejected",
            "session_replay_cross_session_rejected",
        ),
    ],
)
def test_cross_scope_reads_and_replays_are_rejected(
    service: LiveService, token_scope: dict[str, str], read_reason: str, replay_reason: str
) -> None:
    service.approve()
    put_state(service)
    other = service.token(**token_scope)
    read = service.call("GET", service.session_path() + "/state", other)
    assert read.status_code == 403
    assert read.json()["reason"] == read_reason
    assert "read_report" not in read.json()
    replay = service.call("POST", service.session_path() + "/replay-preview", other, json={})
    assert replay.status_code == 403
    assert replay.json()["reason"] == replay_reason
    assert "preview" not in replay.json()


def test_a_role_the_action_does_not_admit_is_rejected(service: LiveService) -> None:
    answer = service.call("GET", service.session_path() + "/state", service.token("auditor"))
    assert answer.status_code == 403
    assert answer.json()["reason"] == "role_not_permitted"


# --- replay preview ----------------------------------------------------------------------


def test_replay_explains_inputs_without_raw_payloads(service: LiveService) -> None:
    service.approve()
    put_state(service)
    answer = service.call(
        "POST", service.session_path() + "/replay-preview", service.token(), json={"max_inputs": 8}
    )
    assert answer.status_code == 200
    body = answer.json()
    preview = body["preview"]
    assert preview["allowed"] is True
    assert [i["kind"] for i in preview["retrieval_inputs"]] == ["memory_chain", "retrieval"]
    assert [i["kind"] for i in preview["routing_inputs"]] == ["runtime_profile", "routing"]
    assert [i["kind"] for i in preview["gene_inputs"]] == ["gene_chain"]
    assert preview["raw_payload_exposed"] is False
    assert_decision(body, "replay", True)
    for raw in (
        "user prefers Rust",
        "the borrow checker",
        "coding intent",
        "fix my lifetime error",
    ):
        assert raw not in answer.text


def test_replay_caps_inputs_and_defaults_without_a_body(service: LiveService) -> None:
    service.approve()
    many = [{"anchor_id": f"memory:{i}", "evidence": f"e{i}"} for i in range(20)]
    put_state(service, state_input(memory_anchors=many))
    capped = service.call(
        "POST", service.session_path() + "/replay-preview", service.token(), json={"max_inputs": 3}
    )
    assert len(capped.json()["preview"]["retrieval_inputs"]) == 3
    default = service.call("POST", service.session_path() + "/replay-preview", service.token())
    assert default.status_code == 200
    assert len(default.json()["preview"]["retrieval_inputs"]) == 16


@pytest.mark.parametrize(
    "body", [{"max_inputs": 0}, {"max_inputs": 257}, {"max_inputs": "8"}, {"other": 1}]
)
def test_replay_request_bounds(service: LiveService, body: dict[str, Any]) -> None:
    answer = service.call(
        "POST", service.session_path() + "/replay-preview", service.token(), json=body
    )
    assert answer.status_code == 422
    assert answer.json()["reason"] == "validation_failed"


def test_replay_of_nothing_is_404_with_the_decision(service: LiveService) -> None:
    answer = service.call(
        "POST", service.session_path() + "/replay-preview", service.token(), json={}
    )
    assert answer.status_code == 404
    assert answer.json()["reason"] == "session_state_not_found"
    assert_decision(answer.json(), "replay", True)


# --- corruption --------------------------------------------------------------------------

CANARY = "CORRUPT-CANARY-e2e"


def test_a_corrupt_record_fails_closed_with_a_redacted_error(service: LiveService) -> None:
    stored = ('{"schema":"sessionstate.record.v1","note":"' + CANARY + '"}').encode()
    key = LaneKey(TenantResourceLane.SESSION_STATE, "tenant-a", "ws-1", "chat-1")
    service.context.lanes.put(key, stored)
    read = service.call("GET", service.session_path() + "/state", service.token())
    assert read.status_code == 200
    assert "ETag" not in read.headers
    report = read.json()["read_report"]
    assert report["record"] is None
    assert report["corrupt"] is True
    assert report["redacted_error"] == "session_state_schema_mismatch"
    assert report["error_digest"] == "sha256:" + hashlib.sha256(stored).hexdigest()
    assert report["raw_payload_exposed"] is False
    replay = service.call(
        "POST", service.session_path() + "/replay-preview", service.token(), json={}
    )
    preview = replay.json()["preview"]
    assert preview["allowed"] is False
    assert preview["retrieval_inputs"] == preview["routing_inputs"] == preview["gene_inputs"] == []
    assert preview["blocked_reasons"] == ["session_state_schema_mismatch"]
    for answer in (read, replay):
        assert CANARY not in answer.text
    metrics = service.call("GET", "/metrics").text
    assert 'sessionstate_corrupt_reads_total{label="session_state_schema_mismatch"} 2.0' in metrics


def test_a_damaged_record_with_versions_fails_closed_as_corrupt(service: LiveService) -> None:
    """The record differs from its newest version however often it is read: that is damage,
    not a write landing between the reads, so the read reports it corrupt (not 503)."""
    service.approve()
    put_state(service)
    key = LaneKey(TenantResourceLane.SESSION_STATE, "tenant-a", "ws-1", "chat-1")
    stored = service.context.lanes.get(key)
    assert stored is not None
    damaged = stored.replace(b'"token_estimate":4', b'"token_estimate":5', 1)
    assert damaged != stored
    service.context.lanes.put(key, damaged)
    read = service.call("GET", service.session_path() + "/state", service.token())
    assert read.status_code == 200
    report = read.json()["read_report"]
    assert report["corrupt"] is True and report["record"] is None
    assert report["error_digest"] == "sha256:" + hashlib.sha256(damaged).hexdigest()


def test_a_valid_record_of_another_scope_reads_as_corrupt(service: LiveService) -> None:
    service.approve()
    put_state(service)
    stored = service.context.lanes.get(
        LaneKey(TenantResourceLane.SESSION_STATE, "tenant-a", "ws-1", "chat-1")
    )
    assert stored is not None
    service.context.lanes.put(
        LaneKey(TenantResourceLane.SESSION_STATE, "tenant-a", "ws-1", "chat-2"), stored
    )
    answer = service.call(
        "GET", service.session_path(s="chat-2") + "/state", service.token(session="chat-2")
    )
    assert answer.json()["read_report"]["redacted_error"] == "session_state_scope_mismatch"
