"""How a denial's many reason codes become its one `reason`."""

from __future__ import annotations

import re

from service.api.reasons import REASON_PRECEDENCE, primary_reason
from tests.support.paths import ROOT


def test_every_scope_or_access_code_the_policies_can_return_has_an_explicit_precedence() -> None:
    """A new cross-tenant or access code must be ranked on purpose, not by its spelling."""
    root = ROOT / "policies"
    codes = {
        code
        for path in root.rglob("*.rego")
        if not path.name.endswith("_test.rego")
        for code in re.findall(r'contains "([a-z_]+)"', path.read_text())
    }
    ranked = {code for rank in REASON_PRECEDENCE for code in rank}
    assert ranked <= codes
    scoped = {code for code in codes if "cross_" in code or code in {"role_not_permitted"}}
    assert scoped <= ranked


def test_access_then_tenant_then_session_then_the_rest() -> None:
    assert primary_reason(["session_state_durable_writes_disabled", "role_not_permitted"]) == (
        "role_not_permitted"
    )
    assert (
        primary_reason(["cross_session_scope_rejected", "cross_tenant_scope_rejected"])
        == "cross_tenant_scope_rejected"
    )
    assert (
        primary_reason(
            ["session_state_operator_approval_missing", "session_state_durable_writes_disabled"]
        )
        == "session_state_durable_writes_disabled"
    )
    assert primary_reason([]) == "policy_denied"
