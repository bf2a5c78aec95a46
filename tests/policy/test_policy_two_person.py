"""Two people for production: with SESSIONSTATE_POLICY_ACTIVATION_APPROVALS=2, a new policy
revision goes live only once a second operator approves it (`sessionstate policy approve`);
the `sessionstate.approval` policy decides each approval (`policy.approve`), the old revision
decides meanwhile, and the request, every approval decision and the activation are on the
`~system` chain. A start serves only the revision the deployment activated last.

End to end over real `sessionstate serve` processes with their OPA sidecar.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.policy.test_policy_activations import _activations, _cli, _edit, _stop, policies, serving
from tests.support.live import JWT_SECRET
from tests.support.served import ROOT, Served, free_port, start

__all__ = ["policies", "serving"]  # the fixtures, shared with the activations' tests


class IdentityProvider:
    """An RS256 key pair whose public half the service is given: tokens only it can sign."""

    def __init__(self, tmp: Path) -> None:
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.public_key_file = tmp / "idp.pub.pem"
        self.public_key_file.write_bytes(
            self._key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self._tmp = tmp

    def token_file(self, sub: str, tenant: str | None = None) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {"sub": sub, "roles": ["operator"], "iat": now, "exp": now + 600}
        if tenant is not None:
            claims["tenant"] = tenant
        path = self._tmp / f"{sub}-{tenant}.jwt"
        path.write_text(jwt.encode(claims, self._key, algorithm="RS256"))
        return str(path)


@pytest.fixture
def idp(tmp_path: Path) -> IdentityProvider:
    return IdentityProvider(tmp_path)


def _two(idp: IdentityProvider, policies: Path) -> dict[str, str]:
    return {
        "SESSIONSTATE_POLICY_ACTIVATION_APPROVALS": "2",
        "SESSIONSTATE_JWT_PUBLIC_KEY_FILE": str(idp.public_key_file),
        "SESSIONSTATE_POLICY_DIR": str(policies),
    }


def _readiness(served: Served) -> dict[str, Any]:
    answer = requests.get(served.url + "/readyz", timeout=10)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _run(data_dir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = _cli(data_dir, "policy", *args)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def _system_entries(data_dir: Path) -> list[dict[str, Any]]:
    exported = _cli(data_dir, "decisions", "export", "--tenant", "~system")
    assert exported.returncode == 0, exported.stderr
    return [json.loads(line)["sessionstate"] for line in exported.stdout.splitlines()]


@pytest.mark.slow
def test_a_new_revision_waits_for_a_second_operator_while_the_old_one_decides(
    opa_bin: str, tmp_path: Path, policies: Path, serving: list[Served], idp: IdentityProvider
) -> None:
    env = _two(idp, policies)
    serving.append(served := start(opa_bin, tmp_path / "var", tmp_path, env))
    data_dir = served.data_dir
    first = _readiness(served)["policy_revision"]  # a first start serves its set

    _edit(policies, "a change alice wants live")
    code, asked = _run(data_dir, "reload", "--token-file", idp.token_file("alice"))
    assert code == 3, asked
    second = asked["pending_revision"]
    assert (asked["outcome"], asked["revision"], asked["deciding"]) == (
        "awaiting_approval",
        first,
        True,
    )
    assert second != first and asked["requested_by"] == "alice" and asked["approved_by"] == []
    ready = _readiness(served)
    assert ready["policy_revision"] == first  # OPA decides with the old revision
    assert "policy_activation_awaiting_approval" in ready["warnings"]

    # Nobody counts twice, a tenant's operator approves nothing of the deployment's, a name
    # this host minted (`--operator`) is no person, and only the revision that waits can
    # be approved.
    code, own = _run(data_dir, "approve", second, "--token-file", idp.token_file("alice"))
    assert code == 1 and own["outcome"] == "refused", own
    assert (own["reason"], own["reasons"]) == (
        "policy_activation_denied",
        ["operator_already_approved"],
    )
    scoped_token = idp.token_file("tom", tenant="tenant-a")
    code, scoped = _run(data_dir, "approve", second, "--token-file", scoped_token)
    assert code == 1 and scoped["reasons"] == ["deployment_operator_required"], scoped
    code, minted = _run(data_dir, "approve", second, "--operator", "mallory")
    assert code == 1 and minted["reasons"] == ["identity_provider_token_required"], minted
    code, other = _run(data_dir, "approve", first, "--token-file", idp.token_file("bob"))
    assert code == 1 and other["reason"] == "policy_activation_not_pending", other
    assert _readiness(served)["policy_revision"] == first

    code, approved = _run(data_dir, "approve", second, "--token-file", idp.token_file("bob"))
    assert code == 0, approved
    assert (approved["outcome"], approved["revision"], approved["deciding"]) == (
        "loaded",
        second,
        True,
    )
    assert approved["requested_by"] == "alice" and approved["approved_by"] == ["bob"]
    assert approved["pending_revision"] is None
    ready = _readiness(served)
    assert ready["policy_revision"] == second
    assert "policy_activation_awaiting_approval" not in ready["warnings"]
    (activation,) = _activations(served)[second]
    assert (activation["how"], activation["who"], activation["approved_by"]) == (
        "reload",
        "alice",
        ["bob"],
    )
    assert activation["previous_revision"] == first

    _stop(served)
    entries = _system_entries(data_dir)
    decided = [
        (
            e["decision"]["action"],
            e["decision"]["policy"],
            e["actor"]["sub"],
            e["decision"]["allow"],
        )
        for e in entries
    ]
    assert decided == [
        ("policy.activate", "sessionstate/policy_activation", "system", True),
        ("policy.approve", "sessionstate/approval", "alice", False),
        ("policy.approve", "sessionstate/approval", "tom", False),
        ("policy.approve", "sessionstate/approval", "mallory", False),
        ("policy.approve", "sessionstate/approval", "bob", True),
        ("policy.activate", "sessionstate/policy_activation", "alice", True),
    ]
    asked_of_policy = entries[4]["input"]["activation"]
    assert asked_of_policy == {
        "revision": second,
        "previous_revision": first,
        "requested_by": "alice",
        "approved_by": [],
        "approvals": 2,
        "approver_vouched_by": "identity_provider",
    }
    assert entries[4]["decision"]["policy_revision"] == first  # the old revision decided
    assert entries[5]["input"]["approvals_required"] == 2
    verified = _cli(data_dir, "decisions", "verify", "--tenant", "~system")
    assert verified.returncode == 0 and json.loads(verified.stdout)["entries"] == 6

    # A start serves only the revision the deployment activated last: an unapproved edit
    # does not start; the approved revision does.
    _edit(policies, "an edit nobody approved")
    refused = _serve_once(opa_bin, data_dir, env)
    assert refused.returncode == 2, refused.stderr
    assert "is not the revision this deployment activated last" in refused.stderr
    _edit_back(policies, "an edit nobody approved")
    serving.append(again := start(opa_bin, data_dir, tmp_path, env))
    assert _readiness(again)["policy_revision"] == second


@pytest.mark.slow
def test_a_reload_by_nobody_needs_two_approvals_and_a_new_edit_replaces_the_waiting_one(
    opa_bin: str, tmp_path: Path, policies: Path, serving: list[Served], idp: IdentityProvider
) -> None:
    env = _two(idp, policies)
    serving.append(served := start(opa_bin, tmp_path / "var", tmp_path, env))
    data_dir = served.data_dir
    first = _readiness(served)["policy_revision"]

    _edit(policies, "one edit")
    _, waiting = _run(data_dir, "reload")  # no operator: by `system`, who counts for nobody
    assert waiting["outcome"] == "awaiting_approval" and waiting["requested_by"] == "system"
    _edit(policies, "a second edit")  # by a name this host minted: it counts for nobody
    _, replaced = _run(data_dir, "reload", "--operator", "alice")
    assert replaced["pending_revision"] not in (waiting["pending_revision"], first)
    revision = replaced["pending_revision"]

    code, one = _run(data_dir, "approve", revision, "--token-file", idp.token_file("bob"))
    assert code == 3 and one["outcome"] == "awaiting_approval" and one["approved_by"] == ["bob"]
    code, again = _run(data_dir, "approve", revision, "--token-file", idp.token_file("bob"))
    assert code == 1 and again["reasons"] == ["operator_already_approved"]
    code, two = _run(data_dir, "approve", revision, "--token-file", idp.token_file("carol"))
    assert code == 0 and two["revision"] == revision, two
    assert two["approved_by"] == ["bob", "carol"] and two["requested_by"] == "alice"
    (activation,) = _activations(served)[revision]
    assert activation["who"] == "alice" and activation["approved_by"] == ["bob", "carol"]

    # The directory back at the live revision withdraws what waited.
    _edit(policies, "a third edit")
    _, third = _run(data_dir, "reload")
    assert third["outcome"] == "awaiting_approval"
    _edit_back(policies, "a third edit")
    code, back = _run(data_dir, "reload")
    assert code == 0 and back["outcome"] == "unchanged" and back["pending_revision"] is None
    late_token = idp.token_file("bob")
    code, late = _run(data_dir, "approve", third["pending_revision"], "--token-file", late_token)
    assert code == 1 and late["reason"] == "policy_activation_not_pending"


def _edit_back(policies: Path, note: str) -> None:
    rego = policies / "sessionstate" / "read" / "read.rego"
    rego.write_text(rego.read_text().replace(f"\n# {note}\n", ""))


def _serve_once(
    opa_bin: str, data_dir: Path, extra_env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`sessionstate serve`, expected to stop at its start."""
    env = {
        **os.environ,
        "SESSIONSTATE_DATA_DIR": str(data_dir),
        "SESSIONSTATE_PORT": str(free_port()),
        "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        "SESSIONSTATE_OPA_BIN": opa_bin,
        **extra_env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        start_new_session=True,
    )
    assert done.returncode != -signal.SIGKILL
    return done


def test_two_people_need_an_identity_provider(opa_bin: str, tmp_path: Path, policies: Path) -> None:
    """A token this host mints can name anyone: without an identity provider, no start."""
    env = {
        "SESSIONSTATE_POLICY_ACTIVATION_APPROVALS": "2",
        "SESSIONSTATE_POLICY_DIR": str(policies),
    }
    refused = _serve_once(opa_bin, tmp_path / "var", env)
    assert refused.returncode == 2
    assert "SESSIONSTATE_POLICY_ACTIVATION_APPROVALS above 1 needs an identity provider" in (
        refused.stderr
    )
