"""Tenant settings as policy data: each setting changes its tenant's decisions only.

Real OPA over a copy of the project's policies whose tenant settings document
(policies/sessionstate/tenants/data.json) names one tenant per setting;
`tenant-b` has no entry and keeps the defaults.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.policy.sidecar import OpaSidecar
from service.policy.source import PolicySource, PolicySourceError
from service.policy.tenant_settings import (
    TENANT_SETTINGS_PATH,
    TenantSettingsDocument,
    document_errors,
    render_schema,
)
from tests.support.factories import state_input
from tests.support.live import LiveService, live_service, service_settings
from tests.support.paths import ROOT

POLICY_DIR = ROOT / "policies"
SETTINGS = {
    "settings": [
        {"tenant_id": "tenant-off", "durable_writes": False},
        {"tenant_id": "tenant-short", "max_approval_seconds": 300},
        {"tenant_id": "tenant-writing", "write_task_profiles": ["writing", "general"]},
        {"tenant_id": "tenant-on", "durable_writes": True, "write_task_profiles": ["coding"]},
        {"tenant_id": "tenant-no-exchange", "token_exchange": False},
    ]
}


def with_settings(tmp: Path, document: object) -> Path:
    policies = tmp / "policies"
    shutil.copytree(POLICY_DIR, policies)
    (policies / TENANT_SETTINGS_PATH).write_text(json.dumps(document))
    return policies


@pytest.fixture(scope="module")
def tenants_service(
    opa_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveService]:
    tmp = tmp_path_factory.mktemp("tenants")
    sidecar = OpaSidecar(opa_bin, with_settings(tmp, SETTINGS), tmp / "opa")
    sidecar.start()
    try:
        with live_service(sidecar, service_settings(tmp / "var")) as live:
            yield live
    finally:
        sidecar.stop()


def approve(service: LiveService, tenant: str, ttl: int = 600) -> Any:
    return service.call(
        "POST",
        f"/v1/tenants/{tenant}/workspaces/ws-1/approvals",
        service.operator(tenant),
        json={"ttl_seconds": ttl, "reason": "tests"},
    )


def write(service: LiveService, tenant: str) -> Any:
    assert approve(service, tenant).status_code in (200, 201)
    return service.call(
        "PUT",
        service.session_path(t=tenant) + "/state",
        service.token(tenant=tenant),
        json=state_input(),
    )


def denied_for(answer: Any, code: str) -> None:
    assert answer.status_code == 403, answer.text
    body = answer.json()
    assert body["reason"] == code
    assert body["decision"]["reasons"] == [code]


# --- each setting, over HTTP, for its tenant only -----------------------------------------


def test_a_tenant_without_settings_writes_as_before(tenants_service: LiveService) -> None:
    assert write(tenants_service, "tenant-b").status_code in (200, 201)


def test_durable_writes_off_refuses_that_tenant_s_writes_only(
    tenants_service: LiveService,
) -> None:
    denied_for(write(tenants_service, "tenant-off"), "session_state_tenant_durable_writes_disabled")
    assert write(tenants_service, "tenant-on").status_code in (200, 201)
    assert write(tenants_service, "tenant-b").status_code in (200, 201)
    # A preview still answers, and names what blocks the real write.
    preview = tenants_service.call(
        "POST",
        tenants_service.session_path(t="tenant-off") + "/state/preview",
        tenants_service.token(tenant="tenant-off"),
        json=state_input(),
    )
    assert preview.status_code == 200
    assert preview.json()["write_report"]["blocked_reasons"] == [
        "session_state_tenant_durable_writes_disabled"
    ]


def test_the_longest_approval_binds_that_tenant_s_operators_only(
    tenants_service: LiveService,
) -> None:
    denied_for(
        approve(tenants_service, "tenant-short", ttl=301), "approval_lifetime_over_tenant_limit"
    )
    assert approve(tenants_service, "tenant-short", ttl=300).status_code in (200, 201)
    assert approve(tenants_service, "tenant-b", ttl=3600).status_code in (200, 201)
    listed = tenants_service.call(
        "GET",
        "/v1/tenants/tenant-short/workspaces/ws-1/approvals",
        tenants_service.operator("tenant-short"),
    )
    assert [approval["expires_at"] for approval in listed.json()["approvals"]] != []
    assert len(listed.json()["approvals"]) == 1, "the refused grant stored nothing"


def test_token_exchange_off_refuses_that_tenant_s_exchanges_only(
    tenants_service: LiveService,
) -> None:
    def exchange(tenant: str) -> Any:
        service_token = tenants_service.token(tenant=tenant, session=None)
        form = {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
            "subject_token": service_token,
            "resource": f"/v1/tenants/{tenant}/workspaces/ws-1/sessions/user-42",
        }
        return tenants_service.http.post(tenants_service.url + "/v1/token", data=form, timeout=10)

    refused = exchange("tenant-no-exchange")
    assert refused.status_code == 400
    assert refused.json()["decision"]["reasons"] == ["token_exchange_tenant_disabled"]
    for tenant in ("tenant-b", "tenant-on"):
        assert exchange(tenant).status_code == 200, tenant


def test_task_profiles_limit_that_tenant_s_writes_only(tenants_service: LiveService) -> None:
    # state_input() writes a `coding` session.
    denied_for(write(tenants_service, "tenant-writing"), "session_state_task_profile_not_permitted")
    written = tenants_service.call(
        "PUT",
        tenants_service.session_path(t="tenant-writing") + "/state",
        tenants_service.token(tenant="tenant-writing"),
        json=_with_task_profile(state_input(), "writing"),
    )
    assert written.status_code in (200, 201), written.text
    assert write(tenants_service, "tenant-on").status_code in (200, 201)


def _with_task_profile(body: dict[str, Any], profile: str) -> dict[str, Any]:
    body["runtime_profile"]["task_profile"] = profile
    return body


# --- the document, its schema and its checks -----------------------------------------------


def test_the_committed_settings_schema_is_current() -> None:
    committed = (POLICY_DIR / "schemas" / "tenants" / "settings.json").read_text()
    assert committed == render_schema(), "run `make schema` and commit the result"


def test_the_committed_document_keeps_every_default() -> None:
    document = TenantSettingsDocument.model_validate_json(
        (POLICY_DIR / TENANT_SETTINGS_PATH).read_bytes()
    )
    assert document.settings == []
    assert document_errors((POLICY_DIR / TENANT_SETTINGS_PATH).read_bytes()) == []


@pytest.mark.parametrize(
    ("document", "error"),
    [
        ({"settings": [{"tenant_id": "t", "durable_writes": "no"}]},
         "settings.#1.durable_writes: Input should be a valid boolean"),
        ({"settings": [{"tenant_id": "t", "max_approval_seconds": 0}]},
         "settings.#1.max_approval_seconds: Input should be greater than or equal to 1"),
        ({"settings": [{"tenant_id": "t", "write_task_profiles": ["secret-profile"]}]},
         "settings.#1.write_task_profiles.#1: Input should be"),
        ({"settings": [{"tenant_id": "t"}, {"tenant_id": "t"}]},
         "a tenant has more than one entry"),
        ({"settings": [{"tenant_id": "t", "durabel_writes": False}]},
         "settings.#1: has a key that is no setting"),
        ({"tenant-x": {}}, "document: has a key that is no setting"),
    ],
)  # fmt: skip
def test_a_broken_document_is_named_without_its_values(
    tmp_path: Path, document: object, error: str
) -> None:
    policies = tmp_path / "policies"
    (policies / TENANT_SETTINGS_PATH).parent.mkdir(parents=True)
    (policies / TENANT_SETTINGS_PATH).write_text(json.dumps(document))
    errors = document_errors((policies / TENANT_SETTINGS_PATH).read_bytes())
    assert any(error in found for found in errors), errors
    assert all(found.startswith("sessionstate/tenants/data.json: ") for found in errors)
    assert not any(secret in str(errors) for secret in ("secret-profile", "tenant-x", '"no"'))


def test_a_broken_document_stops_the_start_and_a_reload_keeps_the_last_good(
    opa_bin: str, tmp_path: Path
) -> None:
    bad = {"settings": [{"tenant_id": "t", "durable_writes": "no"}]}
    with pytest.raises(PolicySourceError, match="durable_writes"):
        PolicySource(with_settings(tmp_path / "start", bad), opa_bin).load()
    policies = with_settings(tmp_path / "reload", {"settings": []})
    source = PolicySource(policies, opa_bin)
    good = source.load().revision
    (policies / TENANT_SETTINGS_PATH).write_text(json.dumps(bad))
    refused = source.reload()
    assert (refused.outcome, refused.revision, source.valid) == ("invalid", good, False)
    # A data-only change is a new revision.
    (policies / TENANT_SETTINGS_PATH).write_text(json.dumps(SETTINGS))
    loaded = source.reload()
    assert loaded.outcome == "loaded" and loaded.revision != good
    assert ("/sessionstate/tenants/data.json", json.dumps(SETTINGS).encode()) in (
        source.served.files
    )
