"""One source per contract constant: the routes, the OpenAPI document, OPA's API
authorization and the client all say what `service.api.v1` says."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from sessionstate_client import SessionStateClient, SessionStateError

from service.api import v1 as contract
from service.api.openapi import OPERATIONS, openapi_document
from service.app import create_app
from service.context import ServiceContext
from service.policy.batch import LIVE_BATCH_PACKAGE
from store.scope import TenantScope
from tests.support.paths import ROOT

IGNORED_METHODS = {"HEAD", "OPTIONS"}


def app_routes() -> set[tuple[str, str]]:
    """(method, path template) of every route the Flask app serves."""
    app = create_app(cast(ServiceContext, None))  # routing only: no request is served
    return {
        (method, re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule))
        for rule in app.url_map.iter_rules()
        for method in rule.methods or ()
        if method not in IGNORED_METHODS
    }


def document_operations() -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, operations in openapi_document()["paths"].items()
        for method in operations
    }


def test_every_v1_route_is_an_openapi_operation_and_back() -> None:
    served = {(method, path) for method, path in app_routes() if path.startswith("/v1")}
    described = {(method, path) for method, path in document_operations() if path.startswith("/v1")}
    assert served == described
    assert len(served) == 25


def test_the_methods_the_front_lets_through_are_exactly_those_some_route_serves() -> None:
    app = create_app(cast(ServiceContext, None))
    served = {method for rule in app.url_map.iter_rules() for method in rule.methods or ()}
    assert served == contract.METHODS
    assert contract.method_label("PATCH") == contract.method_label("x" * 7000) == "OTHER"


def test_every_described_operation_is_served() -> None:
    assert document_operations() <= app_routes()


def test_operations_name_their_path_parameters_with_the_contract_s_schemas() -> None:
    for op in OPERATIONS:
        names = contract.parameters(op.path)
        assert set(names) <= set(contract.PATH_SCHEMAS), op.path
        described = openapi_document()["paths"][op.path][op.method]["parameters"]
        schemas = {p["name"]: p["schema"] for p in described if p["in"] == "path"}
        assert schemas == {name: contract.PATH_SCHEMAS[name] for name in names}


def test_a_version_in_a_path_is_bounded_as_the_route_bounds_it() -> None:
    """The document states the largest version the route takes (2^53 - 1), so a client
    or a fuzzer reading it never sends a valid-looking version the route refuses."""
    assert contract.PATH_SCHEMAS["version"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 2**53 - 1,
    }
    assert contract.VERSION.fullmatch(str(2**53 - 1)) is not None


def test_opa_serves_exactly_the_packages_that_decide_an_action() -> None:
    """`_decision_packages` in authz.rego is the set of `DECISION_PACKAGES`' packages, and the
    service's batch of them (`service.policy.batch`)."""
    authz = (ROOT / "policies" / "system" / "authz" / "authz.rego").read_text()
    (listed,) = re.findall(r"^_decision_packages := \{([^}]*)\}$", authz, re.MULTILINE)
    in_rego = set(re.findall(r'"([a-z_]+)"', listed))
    assert in_rego == {*contract.DECISION_PACKAGES.values(), LIVE_BATCH_PACKAGE}
    for package in in_rego - {LIVE_BATCH_PACKAGE}:  # and each is a package with a decision
        source = (ROOT / "policies" / "sessionstate" / package / f"{package}.rego").read_text()
        assert f"package sessionstate.{package}\n" in source
        assert re.search(r"^decision := ", source, re.MULTILINE)


# --- the client ----------------------------------------------------------------------------

SCOPE = TenantScope(tenant_id="tenant-a", workspace_id="ws-1", session_id="chat-1")
CALLS: dict[str, Callable[[SessionStateClient], Any]] = {
    "preview_state": lambda c: c.preview_state(SCOPE, {}),
    "put_state": lambda c: c.put_state(SCOPE, {}, if_none_match=True),
    "get_state": lambda c: c.get_state(SCOPE),
    "versions": lambda c: c.versions(SCOPE, limit=2, cursor="c"),
    "read_version": lambda c: c.read_version(SCOPE, 2),
    "rewind": lambda c: c.rewind(SCOPE, 1, if_match="sha256:" + "0" * 64),
    "fork": lambda c: c.fork(SCOPE, "chat-2", 3),
    "replay_preview": lambda c: c.replay_preview(SCOPE, 4),
    "erase": lambda c: c.erase(SCOPE),
    "list_sessions": lambda c: c.list_sessions("tenant-a", "ws-1", limit=2),
    "erase_workspace": lambda c: c.erase_workspace("tenant-a", "ws-1"),
    "grant_approval": lambda c: c.grant_approval("tenant-a", "ws-1", {"ttl_seconds": 60}),
    "list_approvals": lambda c: c.list_approvals("tenant-a", "ws-1"),
    "revoke_approval": lambda c: c.revoke_approval("tenant-a", "ws-1", "appr_" + "0" * 24),
    "list_decisions": lambda c: c.list_decisions(limit=2, allow=True),
    "iter_decisions": lambda c: list(c.iter_decisions(since=datetime(2026, 1, 1, tzinfo=UTC))),
    "get_decision": lambda c: c.get_decision("local-0123abcd"),
    "verify_decisions": lambda c: c.verify_decisions(full=True),
    "policy_revisions": lambda c: c.policy_revisions("tenant-a"),
    "exchange_token": lambda c: c.exchange_token("subject-token", SCOPE),
    "export_decisions": lambda c: list(c.export_decisions(action="write")),
    "healthz": lambda c: c.healthz(),
    "readyz": lambda c: c.readyz(),
    "metrics": lambda c: c.metrics(),
    "openapi": lambda c: c.openapi(),
}


def test_every_call_of_the_client_is_checked_below() -> None:
    public = {
        name
        for name in vars(SessionStateClient)
        if not name.startswith("_") and callable(getattr(SessionStateClient, name))
    }
    assert public - {"close", "with_token"} == set(CALLS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_client_asks_only_for_operations_of_the_contract(name: str) -> None:
    asked: list[tuple[str, str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append((request.method, request.url.raw_path.decode().split("?")[0]))
        return httpx.Response(500, json={})  # not retried: one request a call

    with (
        SessionStateClient(
            "http://sessionstate.test", "token", transport=httpx.MockTransport(answer)
        ) as client,
        pytest.raises(SessionStateError),
    ):
        CALLS[name](client)
    ((method, path),) = asked
    templates = {(m, p) for m, p in document_operations()} | {("GET", contract.OPENAPI)}
    assert any(
        method == described and _matches(template, path) for described, template in templates
    ), (method, path)


def _matches(template: str, path: str) -> bool:
    names = contract.parameters(template)
    pattern = re.escape(template)
    for name in names:
        pattern = pattern.replace(re.escape("{" + name + "}"), "(" + _bare(name) + ")")
    return re.fullmatch(pattern, path) is not None


def _bare(name: str) -> str:
    return contract.PATH_PATTERNS[name].removeprefix("^").removesuffix("$")


# --- the seams ---------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


SERVING = {"service/app.py", "service/runtime/serving.py"}


@pytest.mark.parametrize(
    "path",
    sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "service").rglob("*.py")
        if "http" not in path.relative_to(ROOT).parts[:2]
    ),
)
def test_the_domain_knows_no_http_framework(path: str) -> None:
    """Only the HTTP room (and the app and server that assemble it) imports it or Flask."""
    if path in SERVING:
        return
    imported = _imports(ROOT / path)
    assert not {
        name
        for name in imported
        if name.split(".")[0] in {"flask", "werkzeug", "hypercorn"}
        or name.startswith("service.http")
    }


def test_routes_reach_a_decision_only_through_authorize() -> None:
    """Deciding without enforcing would let a denied request through: one call does both."""
    for path in (ROOT / "service" / "http").glob("*.py"):
        if path.name == "common.py":
            continue
        source = path.read_text()
        assert ".decide(" not in source and ".enforce(" not in source, path.name
        assert "pending_decision =" not in source and "g.pending_decision" not in source
