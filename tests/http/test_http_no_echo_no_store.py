"""What an answer must not carry or leave behind, over real HTTP against the live service.

No echo: a member or query parameter named like a secret never comes back, not
in the status line, a header or the body; errors name it by position. No store:
every answer that can carry state, a record, an approval or a decision (problem
documents and the reviewer's pages included) says `Cache-Control: no-store`.
"""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from store.record.violations import UNKNOWN_MEMBER, UNKNOWN_PARAMETER
from tests.http.test_http_decisions import DECISIONS, auditor
from tests.http.test_ui import UI, sign_in
from tests.support.factories import state_input
from tests.support.live import LiveService

CANARY = "hunter2-password-canary"
APPROVALS = "/v1/tenants/tenant-a/workspaces/ws-1/approvals"


def exchange(
    service: LiveService,
    method: str,
    path: str,
    token: str | None = None,
    body: bytes = b"",
) -> bytes:
    """One request on its own connection; every byte of the answer, as the socket got it."""
    address = urlsplit(service.url)
    head = [
        f"{method} {path} HTTP/1.1",
        f"Host: {address.netloc}",
        "Connection: close",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if token is not None:
        head.append(f"Authorization: Bearer {token}")
    request = ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body
    assert address.hostname is not None and address.port is not None
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def status_and_body(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body else {}


def assert_no_canary(answer: bytes) -> None:
    assert CANARY.encode() not in answer
    assert CANARY.lower().encode() not in answer.lower()
    assert b"hunter2" not in answer.lower()


def with_canary_members() -> dict[str, Any]:
    """A valid input with a member named like a secret at the top and at every depth."""
    body = state_input() | {CANARY: "x"}
    body["runtime_profile"] = body["runtime_profile"] | {CANARY: 1}
    body["memory_anchors"] = [body["memory_anchors"][0] | {CANARY: None}]
    body["turns"] = [body["turns"][0] | {CANARY: [CANARY]}]
    return body


ALL_DEPTHS = [
    [UNKNOWN_MEMBER],
    ["runtime_profile", UNKNOWN_MEMBER],
    ["memory_anchors", 0, UNKNOWN_MEMBER],
    ["turns", 0, UNKNOWN_MEMBER],
]


@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_unknown_state_members_are_reported_by_position(service: LiveService, method: str) -> None:
    path = service.session_path() + ("/state/preview" if method == "POST" else "/state")
    answer = exchange(
        service, method, path, service.token(), json.dumps(with_canary_members()).encode()
    )
    assert_no_canary(answer)
    status, problem = status_and_body(answer)
    assert (status, problem["reason"]) == (422, "validation_failed")
    assert sorted((error["loc"], error["rule"]) for error in problem["errors"]) == sorted(
        (loc, "extra_forbidden") for loc in ALL_DEPTHS
    )


@pytest.mark.parametrize(
    ("path", "token", "body"),
    [
        ("/replay-preview", "model", {"max_inputs": 4, CANARY: 1}),
        ("approvals", "operator", {"ttl_seconds": 600, "reason": "r", CANARY: True}),
    ],
    ids=["replay-preview", "approval-grant"],
)
def test_unknown_members_of_other_bodies_are_reported_by_position(
    service: LiveService, path: str, token: str, body: dict[str, Any]
) -> None:
    target = APPROVALS if path == "approvals" else service.session_path() + path
    bearer = service.operator() if token == "operator" else service.token()
    answer = exchange(service, "POST", target, bearer, json.dumps(body).encode())
    assert_no_canary(answer)
    status, problem = status_and_body(answer)
    assert status == 422
    assert problem["errors"] == [{"loc": [UNKNOWN_MEMBER], "rule": "extra_forbidden"}]


@pytest.mark.parametrize(
    "body",
    [
        b'{"' + CANARY.encode() + b'": 1, "' + CANARY.encode() + b'": 2}',  # duplicate keys
        b'{"' + CANARY.encode() + b'": ',  # cut short
        b'[{"' + CANARY.encode() + b'": 1}]',  # not an object
    ],
    ids=["duplicate", "truncated", "array"],
)
def test_malformed_bodies_with_such_members_do_not_echo_them(
    service: LiveService, body: bytes
) -> None:
    path = service.session_path() + "/state/preview"
    answer = exchange(service, "POST", path, service.token(), body)
    assert_no_canary(answer)
    assert status_and_body(answer)[0] in (400, 422)


@pytest.mark.parametrize("route", [DECISIONS, DECISIONS + "/export"])
def test_unknown_query_parameters_are_reported_as_such(service: LiveService, route: str) -> None:
    answer = exchange(service, "GET", f"{route}?{CANARY}=1&limit=0", auditor(service))
    assert_no_canary(answer)
    status, problem = status_and_body(answer)
    assert status == 422
    assert sorted((error["loc"], error["rule"]) for error in problem["errors"]) == [
        (["query", UNKNOWN_PARAMETER], "extra_forbidden"),
        (["query", "limit"], "greater_than_equal"),
    ]


@pytest.mark.parametrize(
    "query",
    [f"action={CANARY}", f"cursor={CANARY}", f"since={CANARY}", f"tenant_id={CANARY}%20x"],
)
def test_bad_query_values_are_not_echoed_either(service: LiveService, query: str) -> None:
    answer = exchange(service, "GET", f"{DECISIONS}?{query}", auditor(service))
    assert_no_canary(answer)
    assert status_and_body(answer)[0] == 422


def test_the_reviewer_page_ignores_unknown_parameters_without_echo(service: LiveService) -> None:
    browser = sign_in(service, auditor(service))
    answer = browser.get(f"{service.url}{UI}?{CANARY}=1", allow_redirects=False, timeout=10)
    assert answer.status_code == 200
    assert CANARY not in answer.text
    assert all(CANARY not in value for value in answer.headers.values())


# --- Cache-Control: no-store -------------------------------------------------------------


def answers_of_every_family(service: LiveService) -> dict[str, requests.Response]:
    """One answer from each route family, successes and problems alike."""
    path = service.session_path()
    model, operator, reviewer = service.token(), service.operator(), auditor(service)
    answers: dict[str, requests.Response] = {}

    def call(name: str, method: str, route: str, token: str | None, **kwargs: Any) -> None:
        answers[name] = service.call(method, route, token, **kwargs)

    call("approval grant", "POST", APPROVALS, operator, json={"ttl_seconds": 600, "reason": "r"})
    approval_id = answers["approval grant"].json()["approval"]["approval_id"]
    call("approval list", "GET", APPROVALS, operator)
    call("state preview", "POST", path + "/state/preview", model, json=state_input())
    call("state put", "PUT", path + "/state", model, json=state_input())
    call("state get", "GET", path + "/state", model)
    call("replay preview", "POST", path + "/replay-preview", model, json={})
    call("412 precondition", "PUT", path + "/state", model, json=state_input(), headers={"If-None-Match": "*"})  # fmt: skip
    call("413 body", "POST", path + "/state/preview", model, data=b"[" * (1024 * 1024 + 1), headers={"Content-Type": "application/json"})  # fmt: skip
    call("422 body", "POST", path + "/state/preview", model, json={"runtime_profile": 1})
    call("approval revoke", "DELETE", f"{APPROVALS}/{approval_id}", operator)
    call("decisions list", "GET", DECISIONS, reviewer)
    decision_id = answers["decisions list"].json()["decisions"][0]["decision"]["decision_id"]
    call("decision get", "GET", f"{DECISIONS}/{decision_id}", reviewer)
    call("decisions verify", "GET", DECISIONS + "/verify", reviewer)
    call("decisions export", "GET", DECISIONS + "/export", reviewer)
    call("401 token", "GET", path + "/state", None)
    call(
        "403 denial", "PUT", service.session_path(s="chat-2") + "/state", model, json=state_input()
    )
    call("403 cross tenant", "GET", service.session_path(t="tenant-b") + "/state", model)
    call("404 no state", "GET", service.session_path(s="chat-2") + "/state", service.token(session="chat-2"))  # fmt: skip
    call("404 no decision", "GET", f"{DECISIONS}/no-such-decision", reviewer)
    call("404 route", "GET", "/v1/nowhere", None)
    call("405 method", "POST", path + "/state", model)
    call("400 scope id", "GET", service.session_path(s="bad id") + "/state", model)
    call("422 query", "GET", DECISIONS + "?limit=0", reviewer)
    call("health", "GET", "/healthz", None)
    call("readiness", "GET", "/readyz", None)
    call("metrics", "GET", "/metrics", None)
    browser = sign_in(service, reviewer)
    for name, route in (
        ("ui decisions", UI),
        ("ui decision", f"{UI}/{decision_id}"),
        ("ui 404", f"{UI}/no-such-decision"),
        ("ui unknown path", "/ui/nowhere"),
    ):
        answers[name] = browser.get(service.url + route, allow_redirects=False, timeout=10)
    answers["ui sign-in page"] = requests.get(service.url + UI, timeout=10)
    answers["ui sign-in refused"] = requests.post(
        service.url + "/ui/login", data={"token": "nope"}, allow_redirects=False, timeout=10
    )
    return answers


def test_every_answer_that_carries_state_or_decisions_is_no_store(service: LiveService) -> None:
    answers = answers_of_every_family(service)
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {
        "approval grant": 201,
        "approval list": 200,
        "state preview": 200,
        "state put": 201,
        "state get": 200,
        "replay preview": 200,
        "approval revoke": 204,
        "decisions list": 200,
        "decision get": 200,
        "decisions verify": 200,
        "decisions export": 200,
        "401 token": 401,
        "403 denial": 403,
        "403 cross tenant": 403,
        "404 no state": 404,
        "404 no decision": 404,
        "404 route": 404,
        "405 method": 405,
        "400 scope id": 400,
        "412 precondition": 412,
        "413 body": 413,
        "422 body": 422,
        "422 query": 422,
        "health": 200,
        "readiness": 200,
        "metrics": 200,
        "ui decisions": 200,
        "ui decision": 200,
        "ui 404": 404,
        "ui unknown path": 404,
        "ui sign-in page": 200,
        "ui sign-in refused": 401,
    }
    cached = {
        name: answer.headers.get("Cache-Control")
        for name, answer in answers.items()
        if answer.headers.get("Cache-Control") != "no-store"
    }
    assert cached == {}


def test_the_public_api_description_may_be_cached(service: LiveService) -> None:
    """The OpenAPI document and the Swagger UI's assets are the same for every caller."""
    for route in ("/openapi.json", "/docs/", "/docs/swagger-ui.css"):
        answer = service.call("GET", route)
        assert answer.status_code == 200, route
        assert "no-store" not in answer.headers.get("Cache-Control", ""), route
