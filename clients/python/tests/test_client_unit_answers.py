"""Successful answers are validated with the wire models, and anything else is refused.

An answer of the right status but the wrong shape raises `UnexpectedResponse`
(`response_not_in_contract`) without quoting the body or chaining pydantic's
error, whose text could. Members a newer service adds are ignored. The
decision log's export is streamed line by line, and `iter_decisions` pages
through the log until it reaches the entry of its own first read.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from conftest import SCOPE, Endpoints, Scripted, decision, log_entry, refusal, template
from sessionstate_client import NotFound, SessionStateError, UnexpectedResponse
from sessionstate_client.models import (
    ApprovalListResponse,
    ApprovalResponse,
    DecisionEntryResponse,
    DecisionListResponse,
    DecisionVerifyResponse,
    Health,
    PolicyRevisionsResponse,
    Readiness,
    ReplayPreviewResponse,
    SessionListResponse,
    SessionStateReadResponse,
    SessionStateResponse,
    SessionVersionsResponse,
    TokenExchangeResponse,
    WorkspaceErasureResponse,
)

CANARY = "ANSWER-BODY-CANARY-3b7e"


def test_each_call_returns_its_wire_model() -> None:
    with Endpoints().sync_client() as client:
        assert isinstance(client.get_state(SCOPE), SessionStateReadResponse)
        assert isinstance(client.preview_state(SCOPE, template()), SessionStateResponse)
        assert isinstance(client.put_state(SCOPE, template()), SessionStateResponse)
        assert isinstance(client.replay_preview(SCOPE), ReplayPreviewResponse)
        assert isinstance(client.versions(SCOPE), SessionVersionsResponse)
        assert client.read_version(SCOPE, 1).version == 1
        assert client.rewind(SCOPE, 1, if_match="sha256:" + "0" * 64).version == 3
        assert client.fork(SCOPE, "chat-2", 3).version == 1
        assert client.erase(SCOPE) == "d-erase"
        assert isinstance(client.list_sessions("tenant-a", "ws-1"), SessionListResponse)
        erased = client.erase_workspace("tenant-a", "ws-1")
        assert isinstance(erased, WorkspaceErasureResponse)
        assert isinstance(client.exchange_token("svc", SCOPE), TokenExchangeResponse)
        grant = {"ttl_seconds": 60, "reason": "unit"}
        assert isinstance(client.grant_approval("tenant-a", "ws-1", grant), ApprovalResponse)
        assert isinstance(client.list_approvals("tenant-a", "ws-1"), ApprovalListResponse)
        assert client.revoke_approval("tenant-a", "ws-1", "appr_1") == "d-revoke"
        assert isinstance(client.list_decisions(), DecisionListResponse)
        assert isinstance(client.get_decision("d-1"), DecisionEntryResponse)
        assert isinstance(client.verify_decisions(), DecisionVerifyResponse)
        assert isinstance(client.policy_revisions(), PolicyRevisionsResponse)
        assert list(client.export_decisions()) == [{"decision_id": "d-1"}, {"decision_id": "d-2"}]
        assert client.healthz() == Health(status="ok")
        assert isinstance(client.readyz(), Readiness)
        assert client.metrics() == "sessionstate_up 1\n"
        assert client.openapi() == {"openapi": "3.1.0"}


def test_members_a_newer_service_adds_are_ignored() -> None:
    body = {"status": "ok", "uptime_seconds": 12, "build": {"commit": "abc"}}
    with Scripted(httpx.Response(200, json=body)).sync_client() as client:
        assert client.healthz() == Health(status="ok")


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b'{"read_report": "' + CANARY.encode() + b'"}', id="wrong-shape"),
        pytest.param(CANARY.encode(), id="not-json"),
        pytest.param(b'{"read_report": {"key_digest": ', id="truncated"),
        pytest.param(b"[]", id="a-list"),
    ],
)
def test_an_answer_outside_the_contract_is_unexpected_and_never_quoted(content: bytes) -> None:
    answer = httpx.Response(200, content=content, headers={"X-Request-Id": "req-5"})
    with Scripted(answer).sync_client() as client, pytest.raises(UnexpectedResponse) as raised:
        client.get_state(SCOPE)
    error = raised.value
    assert (error.status, error.reason, error.request_id) == (
        200,
        "response_not_in_contract",
        "req-5",
    )
    assert CANARY not in str(error) and CANARY not in repr(error)
    assert error.__cause__ is None and error.__suppress_context__


def test_an_unexpected_answer_is_not_retried() -> None:
    service = Scripted(httpx.Response(200, json={"nothing": "useful"}))
    with service.sync_client() as client, pytest.raises(UnexpectedResponse):
        client.get_state(SCOPE)
    assert len(service.requests) == 1


def test_a_status_outside_the_calls_own_is_an_error_even_with_a_good_body() -> None:
    # A grant answers 201; a 200 is not the contract's answer to it.
    granted = {"approval": {}, "decision": decision("approval.grant")}
    client = Scripted(httpx.Response(200, json=granted)).sync_client()
    with client, pytest.raises(UnexpectedResponse) as raised:
        client.grant_approval("tenant-a", "ws-1", {"ttl_seconds": 1, "reason": "r"})
    assert (raised.value.status, raised.value.reason) == (200, "http_200")


def test_a_revocation_without_its_decision_id_is_unexpected() -> None:
    client = Scripted(httpx.Response(204)).sync_client()
    with client, pytest.raises(UnexpectedResponse) as raised:
        client.revoke_approval("tenant-a", "ws-1", "appr_1")
    assert raised.value.reason == "response_not_in_contract"


@pytest.mark.parametrize("content", [b"[1]", b"not json", b'"text"'])
def test_an_openapi_document_must_be_a_json_object(content: bytes) -> None:
    client = Scripted(httpx.Response(200, content=content)).sync_client()
    with client, pytest.raises(UnexpectedResponse):
        client.openapi()


def test_the_export_is_sent_only_when_iterated() -> None:
    service = Endpoints()
    with service.sync_client() as client:
        events = client.export_decisions(action="write")
        assert service.requests == []
        assert next(events) == {"decision_id": "d-1"}
        assert len(service.requests) == 1
        assert service.requests[0].url.params["action"] == "write"


@pytest.mark.parametrize("line", [b"[1, 2]", b"not json", b"42"])
def test_an_export_line_that_is_not_an_event_is_unexpected(line: bytes) -> None:
    content = b'{"decision_id": "d-1"}\n' + line + b"\n"
    with Scripted(httpx.Response(200, content=content)).sync_client() as client:
        events = client.export_decisions()
        assert next(events) == {"decision_id": "d-1"}
        with pytest.raises(UnexpectedResponse):
            next(events)


def test_an_export_refused_raises_when_iterated() -> None:
    with Scripted(refusal(404, "not_found")).sync_client() as client:
        events = client.export_decisions()
        with pytest.raises(NotFound):
            list(events)


def page(entries: list[dict[str, object]], cursor: str | None, read_id: str) -> httpx.Response:
    body = {
        "decisions": entries,
        "next_cursor": cursor,
        "decision": decision("decisions.read", decision_id=read_id),
    }
    return httpx.Response(200, json=body)


def test_iter_decisions_follows_the_cursor_to_the_last_page() -> None:
    service = Scripted(
        page([log_entry(1, "a"), log_entry(2, "b")], "cursor-2", "read-1"),
        page([log_entry(3, "c")], None, "read-2"),
    )
    with service.sync_client() as client:
        ids = [entry.decision.decision_id for entry in client.iter_decisions(page_size=2)]
    assert ids == ["a", "b", "c"]
    assert [dict(r.url.params) for r in service.requests] == [
        {"limit": "2"},
        {"limit": "2", "cursor": "cursor-2"},
    ]


def test_iter_decisions_stops_at_the_entry_of_its_own_first_read() -> None:
    service = Scripted(
        page([log_entry(1, "a")], "cursor-2", "read-1"),
        page([log_entry(2, "b"), log_entry(3, "read-1"), log_entry(4, "read-2")], "c-3", "read-2"),
    )
    with service.sync_client() as client:
        ids = [entry.decision.decision_id for entry in client.iter_decisions()]
    assert ids == ["a", "b"]  # never its own reads, and no third page
    assert len(service.requests) == 2


def test_a_refused_page_stops_the_iteration_with_its_error() -> None:
    service = Scripted(page([log_entry(1, "a")], "cursor-2", "read-1"), refusal(503, "x"))
    with service.sync_client(retries=0) as client:
        entries = client.iter_decisions()
        assert next(entries).decision.decision_id == "a"
        with pytest.raises(SessionStateError) as raised:
            next(entries)
    assert raised.value.status == 503


def undecodable(status: int) -> httpx.Response:
    """An answer whose body its own Content-Encoding does not decode."""
    return httpx.Response(
        status, headers={"Content-Encoding": "gzip"}, stream=httpx.ByteStream(b"not gzip")
    )


@pytest.mark.parametrize("status", [200, 404, 503])
def test_a_body_its_content_encoding_does_not_describe_is_unexpected(status: int) -> None:
    service = Scripted(undecodable(status))
    with service.sync_client() as client, pytest.raises(UnexpectedResponse) as raised:
        client.get_state(SCOPE)
    assert (raised.value.status, raised.value.reason) == (status, "response_not_in_contract")
    assert raised.value.__cause__ is None and len(service.requests) == 1


def test_an_export_its_content_encoding_does_not_describe_is_unexpected() -> None:
    client = Scripted(undecodable(200)).sync_client()
    with client, pytest.raises(UnexpectedResponse) as raised:
        list(client.export_decisions())
    assert raised.value.reason == "response_not_in_contract"


class BrokenBody(httpx.SyncByteStream):
    """A body whose connection drops after its first bytes."""

    def __iter__(self) -> Iterator[bytes]:
        yield b'{"read_report": '
        raise httpx.ReadError("connection reset")


def test_a_connection_dropped_while_reading_the_body_is_a_failed_attempt() -> None:
    answers = iter([httpx.Response(200, stream=BrokenBody()), refusal(404, "not_found")])
    service = Scripted(lambda request: next(answers))
    with service.sync_client(backoff=0.0) as client, pytest.raises(NotFound) as raised:
        client.get_state(SCOPE)  # safe to repeat: sent again
    assert raised.value.attempts == 2
    answers = iter([httpx.Response(200, stream=BrokenBody())])
    with service.sync_client() as client, pytest.raises(SessionStateError) as unsafe:
        client.put_state(SCOPE, template())  # not safe to repeat: sent once
    assert (unsafe.value.status, unsafe.value.reason) == (None, "connection_failed")
