"""The standalone client (`clients/python`, `sessionstate_client`) says what the service says.

The client may not import the service, so its wire models, constants and
replay planner are copies: generated (models, by scripts/client_models.py) or
written again (the rest). Each is held to its original here: a client model
whose JSON schema differs from the OpenAPI document's component in a field's
name, type, constraints or required-ness fails, and so does a stale models.py.
"""

from __future__ import annotations

import ast
import asyncio
import sys
import typing
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import sessionstate_client
import sessionstate_client.models as client_models
from pydantic import BaseModel, create_model
from pydantic.json_schema import models_json_schema
from sessionstate_client import AsyncSessionStateClient, SessionStateClient, SessionStateError
from sessionstate_client import contract as client_contract
from sessionstate_client._calls import DecisionFilters
from sessionstate_client.digests import DigestKey as ClientDigestKey
from sessionstate_client.digests import estimate_tokens as client_estimate_tokens
from sessionstate_client.replay import canonical_digest as client_canonical_digest
from sessionstate_client.replay import plan_replay

from scripts import client_models as generator
from service.api import v1 as contract
from service.api.openapi import openapi_document
from service.decisions.query import DecisionQuery
from service.policy.input import PolicyAction
from service.replay import SessionReplayPlanner
from store.canonical import canonical_digest
from store.digests import DigestKey
from store.record.builder import estimate_tokens
from store.record.inputs import TurnRole
from store.record.state_record import CompactedTurns
from tests.support.factories import record
from tests.support.paths import ROOT

CLIENT_SOURCE = ROOT / "clients" / "python" / "src" / "sessionstate_client"
REF = "#/components/schemas/{model}"


# --- the wire models ------------------------------------------------------------------------


def _bodies_and_answers(document: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Component names of request bodies (validation schemas) and answers (serialization)."""
    bodies: set[str] = set()
    answers: set[str] = set()
    for operations in document["paths"].values():
        for operation in operations.values():
            body = operation.get("requestBody")
            if body is not None:  # JSON, or the token endpoint's form
                for media in body["content"].values():
                    bodies.add(media["schema"]["$ref"].split("/")[-1])
            for answer in operation["responses"].values():
                for media in answer.get("content", {}).values():
                    if "$ref" in media["schema"]:
                        answers.add(media["schema"]["$ref"].split("/")[-1])
    return bodies, answers


def client_schemas(models: dict[str, type[BaseModel]]) -> dict[str, Any]:
    """The client's components, generated as the service generates its document's."""
    bodies, answers = _bodies_and_answers(openapi_document())
    _, schemas = models_json_schema(
        [(models[name], "validation") for name in sorted(bodies)]
        + [(models[name], "serialization") for name in sorted(answers)],
        ref_template=REF,
    )
    return dict(schemas["$defs"])


def server_component(name: str) -> dict[str, Any]:
    """The document's component, as a client model must match it: a response model
    ignores members it does not know (a newer service may add some), so only
    request models keep `additionalProperties: false`."""
    component = dict(openapi_document()["components"]["schemas"][name])
    if name not in client_models.REQUEST_MODELS and component.get("additionalProperties") is False:
        del component["additionalProperties"]
    return component


def disagreements(models: dict[str, type[BaseModel]]) -> list[str]:
    server = openapi_document()["components"]["schemas"]
    client = client_schemas(models)
    found = [f"{name}: missing from the client" for name in sorted(set(server) - set(client))]
    found += [f"{name}: not in the document" for name in sorted(set(client) - set(server))]
    for name in sorted(set(server) & set(client)):
        if client[name] != server_component(name):
            found.append(f"{name}: {_field_differences(server_component(name), client[name])}")
    return found


def _field_differences(server: dict[str, Any], client: dict[str, Any]) -> str:
    fields = set(server.get("properties", {})) | set(client.get("properties", {}))
    differing = sorted(
        name
        for name in fields
        if server.get("properties", {}).get(name) != client.get("properties", {}).get(name)
    )
    required = set(server.get("required", [])) ^ set(client.get("required", []))
    return f"fields {differing}, required-ness {sorted(required)}, or the model's own keys"


def _client_models() -> dict[str, type[BaseModel]]:
    return {
        name: value
        for name, value in vars(client_models).items()
        if isinstance(value, type) and issubclass(value, BaseModel)
    }


def test_every_client_model_matches_its_openapi_component() -> None:
    assert disagreements(_client_models()) == []


@pytest.mark.parametrize(
    ("model", "field", "kind"),
    [
        ("Health", "status", (int, 0)),  # a type
        ("ApprovalGrantInput", "reason", (str | None, None)),  # required-ness
        ("ApprovalGrantInput", "ttl_seconds", (int, ...)),  # constraints (ge=1, le=86400) dropped
    ],
)
def test_a_model_that_disagrees_on_a_field_is_caught(
    model: str, field: str, kind: tuple[Any, Any]
) -> None:
    models = _client_models()
    original = models[model]
    changed = create_model(  # type: ignore[call-overload]
        model, __base__=original, __doc__=original.__doc__, **{field: kind}
    )
    assert disagreements({**models, model: changed}) == [
        f"{model}: fields [{field!r}], required-ness "
        f"{[field] if field == 'reason' else []}, or the model's own keys"
    ]


def test_a_renamed_or_missing_field_is_caught() -> None:
    models = _client_models()
    renamed = create_model(  # a Health with another field name
        "Health", __base__=client_models._Response, __doc__=None, state=(str, "ok")
    )
    (problem,) = disagreements({**models, "Health": renamed})
    assert problem.startswith("Health: fields ['state', 'status']")


def test_the_client_models_are_generated_from_the_current_document() -> None:
    source = generator.generate(openapi_document())
    assert (CLIENT_SOURCE / "models.py").read_text() == source, (
        "clients/python/src/sessionstate_client/models.py is stale: "
        "run .venv/bin/python scripts/client_models.py"
    )


# --- constants, planner and digests written again --------------------------------------------


def test_the_client_contract_constants_are_the_services() -> None:
    names = [
        "SESSION", "WORKSPACE", "STATE", "STATE_PREVIEW", "REPLAY_PREVIEW", "APPROVALS",
        "APPROVAL", "DECISIONS", "DECISIONS_VERIFY", "DECISIONS_EXPORT", "DECISIONS_REVISIONS",
        "DECISION", "EXCHANGE", "JWKS", "HEALTHZ", "READYZ", "METRICS", "OPENAPI",
        "DECISION_ID_HEADER", "IF_MATCH",
        "IF_NONE_MATCH", "RETRY_AFTER", "REQUEST_ID",
    ]  # fmt: skip
    for name in names:
        assert getattr(client_contract, name) == getattr(contract, name), name
    assert contract.PATH_PATTERNS["session_id"] == client_contract.SCOPE_ID_PATTERN
    assert typing.get_args(client_contract.PolicyAction) == typing.get_args(PolicyAction)
    assert typing.get_args(client_contract.TurnRole) == typing.get_args(TurnRole)


def test_decision_filters_are_the_query_of_the_decision_log() -> None:
    assert set(DecisionFilters.__annotations__) | {"limit", "cursor"} == set(
        DecisionQuery.model_fields
    )


def test_the_client_plans_replays_exactly_as_the_service() -> None:
    key = DigestKey(b"k" * 32, key_id="test")
    plain = record(key)
    compacted = plain.model_copy(
        update={
            "compacted_turns": CompactedTurns(
                count=7, token_estimate=40, digest="sha256:" + "1" * 64
            )
        }
    )
    many = record(
        key,
        memory_anchors=[{"anchor_id": f"memory:{n}", "evidence": f"m{n}"} for n in range(5)],
    )
    for server_record in (plain, compacted, many):
        mine = client_models.SessionStateRecord.model_validate(server_record.to_json())
        for max_inputs in (1, 3, 16):
            theirs = SessionReplayPlanner().preview(server_record, max_inputs)
            assert plan_replay(mine, max_inputs).model_dump(mode="json") == theirs.model_dump(
                mode="json"
            )


def test_the_client_digests_as_the_service_does() -> None:
    for text in ["", "hello", "naïve ☃ text", "x" * 1001]:
        assert ClientDigestKey(b"s" * 16).digest_text(text) == DigestKey(b"s" * 16).digest_text(
            text
        )
        assert client_estimate_tokens(text) == estimate_tokens(text)
    value = {"b": [1, True, None, "ü"], "a": {"z": "", "y": 2**53 - 1}}
    assert client_canonical_digest(value) == canonical_digest(value)
    for unsupported in (1.5, 2**53, {"é": 1}):
        with pytest.raises(ValueError, match="canonical encoding"):
            client_canonical_digest(unsupported)


# --- the client stands alone ---------------------------------------------------------------

ALLOWED_IMPORTS = {"httpx", "pydantic", "pydantic_core", "sessionstate_client"}


def test_the_client_imports_nothing_but_httpx_pydantic_and_the_standard_library() -> None:
    for path in sorted(CLIENT_SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert top in ALLOWED_IMPORTS | sys.stdlib_module_names, (path.name, module)


# --- the async client asks exactly what the sync one asks ----------------------------------

SCOPE = client_models.TenantScope(tenant_id="tenant-a", workspace_id="ws-1", session_id="chat-1")
SINCE = datetime(2026, 1, 1, tzinfo=UTC)
STATE = {"runtime_profile": {"context_window": 1}}
CALLS: dict[str, tuple[Callable[[Any], Any], ...]] = {
    "preview_state": (lambda c: c.preview_state(SCOPE, STATE),),
    "put_state": (
        lambda c: c.put_state(SCOPE, STATE, if_none_match=True),
        lambda c: c.put_state(SCOPE, STATE, if_match="sha256:" + "0" * 64),
    ),
    "get_state": (lambda c: c.get_state(SCOPE),),
    "versions": (lambda c: c.versions(SCOPE), lambda c: c.versions(SCOPE, limit=2, cursor="c")),
    "read_version": (lambda c: c.read_version(SCOPE, 3),),
    "rewind": (lambda c: c.rewind(SCOPE, 2, if_match="sha256:" + "0" * 64),),
    "fork": (lambda c: c.fork(SCOPE, "chat-2"), lambda c: c.fork(SCOPE, "chat-2", 3)),
    "exchange_token": (lambda c: c.exchange_token("subject.token.jwt", SCOPE),),
    "replay_preview": (lambda c: c.replay_preview(SCOPE, 4),),
    "erase": (lambda c: c.erase(SCOPE), lambda c: c.erase(SCOPE, if_match="sha256:" + "0" * 64)),
    "list_sessions": (
        lambda c: c.list_sessions("tenant-a", "ws-1"),
        lambda c: c.list_sessions("tenant-a", "ws-1", limit=2, cursor="abc"),
    ),
    "erase_workspace": (lambda c: c.erase_workspace("tenant-a", "ws-1"),),
    "grant_approval": (lambda c: c.grant_approval("tenant-a", "ws-1", {"ttl_seconds": 60}),),
    "list_approvals": (lambda c: c.list_approvals("tenant-a", "ws-1"),),
    "revoke_approval": (lambda c: c.revoke_approval("tenant-a", "ws-1", "appr_" + "0" * 24),),
    "list_decisions": (lambda c: c.list_decisions(limit=2, allow=True, shadow="agree"),),
    "iter_decisions": (lambda c: c.iter_decisions(since=SINCE, action="write"),),
    "get_decision": (lambda c: c.get_decision("local-0123abcd"),),
    "verify_decisions": (lambda c: c.verify_decisions(), lambda c: c.verify_decisions(full=True)),
    "policy_revisions": (lambda c: c.policy_revisions(), lambda c: c.policy_revisions("t-1")),
    "export_decisions": (lambda c: c.export_decisions(action="write", until=SINCE),),
    "healthz": (lambda c: c.healthz(),),
    "readyz": (lambda c: c.readyz(),),
    "metrics": (lambda c: c.metrics(),),
    "openapi": (lambda c: c.openapi(),),
}


def _public(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_") and callable(vars(cls)[name])}


def test_both_clients_have_the_same_methods_and_each_is_checked() -> None:
    assert _public(SessionStateClient) - {"close"} == _public(AsyncSessionStateClient) - {"aclose"}
    assert _public(SessionStateClient) - {"close", "with_token"} == set(CALLS)
    assert set(sessionstate_client.__all__) >= {
        "SessionStateClient",
        "AsyncSessionStateClient",
        "ModelServiceSession",
        "AsyncModelServiceSession",
    }


def _seen(request: httpx.Request) -> tuple[str, str, bytes, list[tuple[str, str]]]:
    headers = sorted(
        (name, value) for name, value in request.headers.items() if name != "x-request-id"
    )
    return request.method, str(request.url), request.read(), headers


def _answer(request: httpx.Request) -> httpx.Response:
    problem = {"type": "t", "title": "t", "status": 404, "detail": "d", "reason": "not_found"}
    return httpx.Response(404, json=problem)


@pytest.mark.parametrize(("name", "number"), [(n, i) for n in CALLS for i in range(len(CALLS[n]))])
def test_the_async_client_sends_what_the_sync_client_sends(name: str, number: int) -> None:
    call = CALLS[name][number]
    sync_seen: list[Any] = []
    async_seen: list[Any] = []

    def sync_answer(request: httpx.Request) -> httpx.Response:
        sync_seen.append(_seen(request))
        return _answer(request)

    async def async_answer(request: httpx.Request) -> httpx.Response:
        async_seen.append(_seen(request))
        return _answer(request)

    url = "http://sessionstate.test"
    with (
        SessionStateClient(url, "token", transport=httpx.MockTransport(sync_answer)) as client,
        pytest.raises(SessionStateError) as sync_error,
    ):
        result = call(client)
        if not isinstance(result, BaseModel | str | dict):
            list(result)  # an iterator: the request goes out when iteration starts

    async def run() -> SessionStateError:
        transport = httpx.MockTransport(async_answer)
        async with AsyncSessionStateClient(url, "token", transport=transport) as client:
            try:
                result = call(client)
                if hasattr(result, "__aiter__"):
                    [item async for item in result]
                else:
                    await result
            except SessionStateError as error:
                return error
        raise AssertionError("no error")

    async_error = asyncio.run(run())
    assert sync_seen == async_seen and len(sync_seen) == 1
    assert type(async_error) is type(sync_error.value)
    assert (async_error.status, async_error.reason) == (404, "not_found")
