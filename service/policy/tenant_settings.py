"""Tenant settings: per-tenant behaviour a security team changes as data, not Rego.

The document is `policies/sessionstate/tenants/data.json`, which OPA serves as
`data.sessionstate.tenants`: `{"settings": [...]}`, one entry per tenant (a
list, not an object keyed by tenant id, so that OPA's type checker can check
every reference to a setting against the schema). A tenant without an entry,
and a setting left out, keep the default behaviour; a setting only ever
restricts. `policies/schemas/tenants/settings.json`
is generated from these models (`python -m service.policy.tenant_settings`), the
Rego is type-checked against it by `opa check --strict`, and a policy
directory whose document breaks it is refused like one that does not compile.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from store.record.inputs import TaskProfile
from store.scope import ScopeId

# Where the document lives in a policy directory, and so in the bundle.
TENANT_SETTINGS_PATH = Path("sessionstate") / "tenants" / "data.json"


class TenantSettings(BaseModel):
    """One tenant's settings; each one left out keeps today's behaviour."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tenant_id: ScopeId = Field(description="the tenant these settings are for")
    durable_writes: bool | None = Field(
        default=None,
        description="false: this tenant's writes are refused "
        "(session_state_tenant_durable_writes_disabled), whatever SESSIONSTATE_DURABLE_WRITES "
        "says; true or absent: the deployment decides",
    )
    max_approval_seconds: int | None = Field(
        default=None,
        ge=1,
        description="the longest approval (expires_at - issued_at, in seconds) this tenant's "
        "operators may grant (approval_lifetime_over_tenant_limit); absent: the service's own "
        "bound alone",
    )
    write_task_profiles: list[TaskProfile] | None = Field(
        default=None,
        description="the task profiles this tenant's model services may write "
        "(session_state_task_profile_not_permitted); absent: every one",
    )
    idle_ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        description="idle expiry: this tenant's sessions not written for this long are erased "
        "by the sweep, when shorter than SESSIONSTATE_STATE_IDLE_TTL_SECONDS (never longer; "
        "with that setting 0, nothing expires); absent: the deployment's TTL",
    )
    token_exchange: bool | None = Field(
        default=None,
        description="false: no session tokens are issued for this tenant's sessions by "
        "token exchange (token_exchange_tenant_disabled); true or absent: the policy's "
        "default (a workspace-scoped model-service token, for sessions of its workspace)",
    )


class TenantSettingsDocument(BaseModel):
    """`data.sessionstate.tenants`: the settings of every tenant that has any."""

    model_config = ConfigDict(extra="forbid", strict=True)

    settings: list[TenantSettings] = Field(
        description="one entry per tenant; a tenant without one keeps the defaults"
    )

    @model_validator(mode="after")
    def _one_entry_per_tenant(self) -> TenantSettingsDocument:
        tenants = [entry.tenant_id for entry in self.settings]
        if len(set(tenants)) != len(tenants):
            raise ValueError("a tenant has more than one entry")
        return self


def tenant_settings_schema() -> dict[str, object]:
    """The JSON Schema OPA types `data.sessionstate.tenants` with, every `$ref` inlined.

    OPA's type checker does not look inside `anyOf`, so each optional setting is
    written as its own type (an absent key is how a setting is left out).
    """
    entry = TenantSettings.model_json_schema()
    properties = {}
    for name, node in entry["properties"].items():
        options = node.pop("anyOf", None)
        if options is not None:
            (kept,) = [option for option in options if option != {"type": "null"}]
            node.pop("default", None)
            node = {**kept, **node}
        properties[name] = node
    document = TenantSettingsDocument.model_json_schema()
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": document["title"],
        "description": document["description"],
        "type": "object",
        "properties": {
            "settings": {
                "description": document["properties"]["settings"]["description"],
                "type": "array",
                "items": {
                    "title": entry["title"],
                    "description": entry["description"],
                    "type": "object",
                    "properties": properties,
                    "required": entry["required"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["settings"],
        "additionalProperties": False,
    }


def render_schema() -> str:
    return json.dumps(tenant_settings_schema(), indent=2, sort_keys=True) + "\n"


def bundled_settings(files: Sequence[tuple[str, bytes]]) -> TenantSettingsDocument | None:
    """The tenant settings among a policy bundle's files; None when absent or unreadable."""
    content = dict(files).get("/" + TENANT_SETTINGS_PATH.as_posix())
    if content is None:
        return None
    try:
        return TenantSettingsDocument.model_validate_json(content)
    except ValidationError:
        return None


def tenant_idle_ttls(files: Sequence[tuple[str, bytes]]) -> dict[str, int]:
    """Each tenant's `idle_ttl_seconds` in a policy bundle's files (none when the document
    is absent or does not read: the deployment's TTL then holds for every tenant)."""
    document = bundled_settings(files)
    if document is None:
        return {}
    return {
        entry.tenant_id: entry.idle_ttl_seconds
        for entry in document.settings
        if entry.idle_ttl_seconds is not None
    }


def document_errors(content: bytes | None) -> list[str]:
    """Why a tenant settings document (its bytes as read into the policy bundle; None: there
    is none) cannot be served; empty when it can.

    Errors name the file, the entry's position and the broken rule, never a value
    (not even a tenant id).
    """
    if content is None:
        return []
    name = TENANT_SETTINGS_PATH.as_posix()
    try:
        TenantSettingsDocument.model_validate_json(content)
    except ValidationError as error:
        found = []
        for detail in error.errors(include_url=False, include_input=False):
            location = list(detail["loc"])
            message = detail["msg"]
            if detail["type"] == "extra_forbidden":  # the key is the document's: not echoed
                location, message = location[:-1], "has a key that is no setting"
            where = ".".join(
                f"#{part + 1}" if isinstance(part, int) else str(part) for part in location
            )
            found.append(f"{name}: {where or 'document'}: {message}")
        return list(dict.fromkeys(found))
    return []


if __name__ == "__main__":  # pragma: no cover - used by `make schema`
    sys.stdout.write(render_schema())
