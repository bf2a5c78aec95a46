"""Bad input gets a clear problem, never a 500, an echo or a partial write; raw text goes nowhere."""

from __future__ import annotations

import base64
import json
import logging
import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from service.app import create_app
from service.observability.logs import JsonFormatter
from service.policy.sidecar import OpaSidecar
from store.key_codec import TenantResourceLane
from tests.support.factories import state_input
from tests.support.live import JWT_SECRET, LiveService, live_service, service_settings

CANARY = "RAW-CANARY-51c9"
PROBLEM = "application/problem+json"


def problem(answer: Any, status: int, reason: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["Content-Type"] == PROBLEM
    body: dict[str, Any] = answer.json()
    assert body["status"] == status
    assert body["reason"] == reason
    assert body["type"].endswith(reason)
    assert body["title"]
    assert body["detail"]
    return body


def preview(service: LiveService, **kwargs: Any) -> Any:
    return service.call(
        "POST", service.session_path() + "/state/preview", service.token(), **kwargs
    )


# --- body -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b'{"runtime_profile": ',
        b"\xff\xfe" + CANARY.encode(),
        b'{"a": 1} {"b": 2}',
        b'{"a": 1, "a": 2}',
        b'{"a": NaN}',
        b"[" * 5000 + b"]" * 5000,
    ],
    ids=["truncated", "not-utf8", "two-documents", "duplicate-keys", "nan", "deep"],
)
def test_malformed_json_is_400(service: LiveService, data: bytes) -> None:
    body = problem(
        preview(service, data=data, headers={"Content-Type": "application/json"}),
        400,
        "malformed_json",
    )
    assert CANARY not in json.dumps(body)


def test_non_json_is_415(service: LiveService) -> None:
    answer = preview(
        service, data=b"payload=x", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    problem(answer, 415, "unsupported_media_type")


def test_over_1_mib_is_413_before_anything_else(service: LiveService) -> None:
    huge = b'{"x": "' + b"a" * (1024 * 1024) + b'"}'
    answer = service.call(
        "POST",
        service.session_path() + "/state/preview",
        None,
        data=huge,
        headers={"Content-Type": "application/json"},
    )
    problem(answer, 413, "body_too_large")


def test_validation_errors_list_paths_and_rules_never_values(service: LiveService) -> None:
    body = state_input(
        turns=[{"turn_id": CANARY + " bad", "role": "narrator", "payload": CANARY}],
        gene_anchors=[{"anchor_id": "gene:x", "evidence_digest": "sha256:" + CANARY}],
    )
    answer = preview(service, json=body)
    document = problem(answer, 422, "validation_failed")
    assert {(tuple(e["loc"]), e["rule"]) for e in document["errors"]} == {
        (("gene_anchors", 0, "evidence_digest"), "string_pattern_mismatch"),
        (("turns", 0, "turn_id"), "string_pattern_mismatch"),
        (("turns", 0, "role"), "literal_error"),
    }
    assert CANARY not in answer.text


def test_conflicting_duplicate_ids_are_422(service: LiveService) -> None:
    turns = [
        {"turn_id": "t1", "role": "user", "payload": "one"},
        {"turn_id": "t1", "role": "user", "payload": "two"},
    ]
    document = problem(preview(service, json=state_input(turns=turns)), 422, "validation_failed")
    assert document["errors"] == [{"loc": ["turns", 1, "turn_id"], "rule": "duplicate_id_conflict"}]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/tenants/Tenant%20A/workspaces/ws-1/sessions/chat-1/state",
        "/v1/tenants/tenant-a%0A/workspaces/ws-1/sessions/chat-1/state",
        "/v1/tenants/tenant-a/workspaces/.ws/sessions/chat-1/state",
        "/v1/tenants/tenant-a/workspaces/ws-1/sessions/" + "x" * 129 + "/state",
        "/v1/tenants/t%C3%A9nant/workspaces/ws-1/sessions/chat-1/state",
    ],
)
def test_invalid_scope_ids_are_400_and_nothing_is_read(service: LiveService, path: str) -> None:
    problem(service.call("GET", path, service.token()), 400, "invalid_scope_id")
    problem(service.call("PUT", path, service.token(), json=state_input()), 400, "invalid_scope_id")


def test_unknown_routes_and_methods_are_problems(service: LiveService) -> None:
    problem(service.call("GET", "/v1/nope"), 404, "not_found")
    problem(  # a method the service serves, not on this route (the front refuses others)
        service.call("POST", service.session_path() + "/state", service.token()),
        405,
        "method_not_allowed",
    )


def test_a_method_no_route_serves_is_logged_and_counted_as_other_never_verbatim(
    service: LiveService, caplog: pytest.LogCaptureFixture
) -> None:
    # The served front refuses such a method before the app (tests/http/test_http_front.py);
    # behind any other server the app still names it by a fixed label.
    method = CANARY.upper().replace("-", "") + "M" * 7000
    behind_another_server = create_app(service.context).test_client()
    with caplog.at_level(logging.INFO, logger="sessionstate.http"):
        answer = behind_another_server.open(
            service.session_path() + "/state",
            method=method,
            headers={"Authorization": f"Bearer {service.token()}"},
        )
    assert answer.status_code == 405
    logged = [r for r in caplog.records if r.getMessage() == "request"]
    assert [getattr(r, "method", None) for r in logged] == ["OTHER"]
    metrics = service.call("GET", "/metrics").text
    assert 'method="OTHER"' in metrics
    assert method[:20] not in metrics
    ours = [r for r in caplog.records if r.name.startswith("sessionstate")]  # not werkzeug's
    assert not any(method[:20] in JsonFormatter().format(record) for record in ours)


# --- authentication ----------------------------------------------------------------------


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (None, "token_missing"),
        (
            _b64({"alg": "none", "typ": "JWT"})
            + "."
            + _b64({"sub": "x", "roles": ["model-service"], "exp": 4102444800})
            + ".",
            "token_invalid",
        ),
        (
            jwt.encode(
                {"sub": "x", "roles": ["model-service"], "exp": 4102444800},
                "another-secret-0123456789abcdef-xyz",
                algorithm="HS256",
            ),
            "token_invalid",
        ),
        (
            jwt.encode(
                {"sub": "x", "roles": ["model-service"], "exp": 1}, JWT_SECRET, algorithm="HS256"
            ),
            "token_expired",
        ),
        (
            jwt.encode({"sub": "x", "roles": ["model-service"]}, JWT_SECRET, algorithm="HS256"),
            "token_claims_invalid",
        ),
        (
            jwt.encode(
                {"roles": ["model-service"], "exp": 4102444800}, JWT_SECRET, algorithm="HS256"
            ),
            "token_claims_invalid",
        ),
        (
            jwt.encode({"sub": "x", "exp": 4102444800}, JWT_SECRET, algorithm="HS256"),
            "token_claims_invalid",
        ),
    ],
    ids=["missing", "alg-none", "wrong-signature", "expired", "no-exp", "no-sub", "no-roles"],
)
def test_bad_tokens_are_401(service: LiveService, token: str | None, reason: str) -> None:
    answer = service.call("GET", service.session_path() + "/state", token)
    body = problem(answer, 401, reason)
    assert "decision" not in body
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")


def _signed(**claims: Any) -> str:
    """A model-service token for chat-1, issued now for five minutes, with overrides."""
    now = int(time.time())
    body = {
        "sub": "svc-1",
        "roles": ["model-service"],
        "tenant": "tenant-a",
        "workspace": "ws-1",
        "session": "chat-1",
        "iat": now,
        "exp": now + 300,
    } | claims
    return jwt.encode({k: v for k, v in body.items() if v is not ...}, JWT_SECRET, "HS256")


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"exp": "4102444800"}, "token_claims_invalid"),  # digits, but a string
        ({"nbf": "0"}, "token_claims_invalid"),
        ({"iat": True}, "token_claims_invalid"),
        ({"exp": 10**30, "iat": ...}, "token_lifetime_too_long"),
        ({"exp": 10**30}, "token_lifetime_too_long"),
        ({"iat": 0}, "token_lifetime_too_long"),  # exp - iat is decades
        ({"sub": "s" * 129}, "token_claims_invalid"),
        ({"roles": ["model-service", "r" * 65]}, "token_claims_invalid"),
    ],
    ids=repr,
)
def test_token_dates_lifetime_and_claim_lengths_are_checked(
    service: LiveService, claims: dict[str, Any], reason: str
) -> None:
    logged = service.context.lanes.count(TenantResourceLane.TRACE_EVIDENCE)  # every chain
    answer = service.call("GET", service.session_path() + "/state", _signed(**claims))
    body = problem(answer, 401, reason)
    assert "decision" not in body
    # Refused before any decision is logged, on any chain.
    assert service.context.lanes.count(TenantResourceLane.TRACE_EVIDENCE) == logged


def test_the_longest_sub_and_role_names_are_accepted(service: LiveService) -> None:
    token = _signed(sub="s" * 128, roles=["model-service", "r" * 64])
    answer = service.call("GET", service.session_path() + "/state", token)
    assert answer.status_code == 404  # authenticated; nothing stored yet


def test_the_maximum_token_lifetime_is_a_setting(sidecar: OpaSidecar, tmp_path: Path) -> None:
    settings = service_settings(tmp_path / "var", jwt_max_lifetime_seconds=600)
    with live_service(sidecar, settings) as short:
        path = short.session_path() + "/state"
        assert short.call("GET", path, short.token(ttl=600)).status_code == 404
        problem(short.call("GET", path, short.token(ttl=601)), 401, "token_lifetime_too_long")


# --- raw text canaries -------------------------------------------------------------------


def _canary_input(tag: str) -> dict[str, Any]:
    profile = state_input()["runtime_profile"] | {"cancellation_anchor": f"{CANARY}-cancel-{tag}"}
    return state_input(
        runtime_profile=profile,
        memory_anchors=[{"anchor_id": "memory:a", "evidence": f"{CANARY}-memory-{tag}"}],
        retrieval_evidence=[{"anchor_id": "doc:a", "evidence": f"{CANARY}-retrieval-{tag}"}],
        routing_evidence=[{"anchor_id": "route:a", "evidence": f"{CANARY}-routing-{tag}"}],
        turns=[{"turn_id": "t1", "role": "user", "payload": f"{CANARY}-payload-{tag}"}],
    )


def test_raw_text_never_reaches_a_response_a_log_opa_or_the_data_dir(
    service: LiveService, sidecar: OpaSidecar, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    service.approve()
    answers = [
        preview(service, json=_canary_input("1")),
        service.call(
            "PUT", service.session_path() + "/state", service.token(), json=_canary_input("2")
        ),
        service.call("GET", service.session_path() + "/state", service.token()),
        service.call("POST", service.session_path() + "/replay-preview", service.token(), json={}),
        preview(
            service,
            json=_canary_input("3") | {"turns": [{"turn_id": "t", "role": "x", "payload": CANARY}]},
        ),
        service.call(
            "PUT",
            service.session_path() + "/state",
            service.token(session="other"),
            json=_canary_input("4"),
        ),
    ]
    assert [a.status_code for a in answers] == [200, 201, 200, 200, 422, 403]
    for answer in answers:
        assert CANARY not in answer.text
        assert all(CANARY not in value for value in answer.headers.values())
    assert CANARY not in caplog.text
    assert CANARY not in service.call("GET", "/metrics").text
    time.sleep(0.2)  # OPA's console decision log is written asynchronously
    assert CANARY.encode() not in sidecar.log_path.read_bytes()
    data_dir = Path(service.settings.data_dir)
    files = [path for path in data_dir.rglob("*") if path.is_file()]
    assert files
    for path in files:
        assert CANARY.encode() not in path.read_bytes(), path


def test_rs256_tokens_are_accepted_with_a_configured_public_key(
    sidecar: OpaSidecar, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from tests.support.live import live_service, service_settings

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = tmp_path / "jwt.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    claims = {"sub": "svc-rs", "roles": ["model-service"], "exp": int(time.time()) + 600}
    claims |= {"tenant": "tenant-a", "workspace": "ws-1", "session": "chat-1"}
    token = jwt.encode(claims, key, algorithm="RS256")
    settings = service_settings(tmp_path / "var", jwt_public_key_file=public)
    with live_service(sidecar, settings) as live:
        assert live.call("GET", live.session_path() + "/state", token).status_code == 404
        public_as_secret = _b64({"alg": "HS256", "typ": "JWT"}) + "." + _b64(claims) + ".AAAA"
        problem(
            live.call("GET", live.session_path() + "/state", public_as_secret), 401, "token_invalid"
        )
