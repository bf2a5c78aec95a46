"""Impact analysis over the session lifecycle's decisions (issue 29): a version list, a
rewind, a fork, a workspace's list and an erasure are replayed from the real store like
any other action, and a candidate that takes erasure from model services loses exactly
their erasures' allow."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.policy.sidecar import OpaSidecar
from tests.support.factories import state_input
from tests.support.impact import impact, impact_env
from tests.support.live import LiveService, live_service, service_settings
from tests.support.paths import POLICY_DIR

LIFECYCLE = ("history", "rewind", "fork", "list", "erase")
NO_MODEL_SERVICE_ERASURE = """
# METADATA
# title: Impact candidate
# description: A model service may no longer erase (what the test's candidate changes).
reasons contains "role_not_permitted" if lib.has_role(input.actor, "model-service")
"""


def _lifecycle(service: LiveService) -> None:
    """Two writes, the versions, a rewind to 1, a fork, a list, and two erasures."""
    state = service.session_path() + "/state"
    service.approve()
    digest = ""
    for turn in (1, 2):
        body = state_input(source_trace_ids=[f"trace:{turn}"])
        answer = service.call("PUT", state, service.token(), json=body)
        assert answer.status_code in (200, 201), answer.text
        digest = answer.json()["record"]["state_digest"]
    assert service.call("GET", state + "/versions", service.token()).ok
    rewound = service.call(
        "POST", state + "/rewind", service.token(), json={"to_version": 1},
        headers={"If-Match": f'"{digest}"'},
    )  # fmt: skip
    assert rewound.status_code in (200, 201), rewound.text
    workspace = service.token(session=None)
    forked = service.call(
        "POST", service.session_path() + "/fork", workspace, json={"to_session_id": "chat-2"}
    )
    assert forked.status_code == 201, forked.text
    listed = service.call("GET", "/v1/tenants/tenant-a/workspaces/ws-1/sessions", workspace)
    assert listed.ok
    for session in ("chat-1", "chat-2"):
        path = service.session_path(s=session) + "/state"
        assert service.call("DELETE", path, service.token(session=session)).status_code == 204


@pytest.fixture(scope="module")
def logged(sidecar: OpaSidecar, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("lifecycle-impact") / "var"
    with live_service(sidecar, service_settings(data_dir, durable_writes=True)) as service:
        _lifecycle(service)
    return data_dir


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, logged: Path, opa_bin: str) -> Path:
    return impact_env(monkeypatch, logged, opa_bin)


def test_the_live_policies_replay_every_lifecycle_action_unchanged(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = impact(capsys, str(POLICY_DIR), "--fail-on", "any")
    assert code == 0
    assert report["changed"] == 0
    for action in LIFECYCLE:
        assert report["by_action"][action]["evaluated"] >= 1, action


def test_a_candidate_that_takes_erasure_from_model_services_loses_exactly_theirs(
    env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    candidate = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, candidate)
    erase = candidate / "sessionstate" / "erase" / "erase.rego"
    erase.write_text(erase.read_text() + NO_MODEL_SERVICE_ERASURE)
    code, report = impact(capsys, str(candidate), "--fail-on", "allow-lost")
    assert code == 3
    assert report["allow_lost"] == 2
    assert report["by_action"]["erase"]["allow_lost"] == 2
    assert all(example["action"] == "erase" for example in report["examples"])
    _, only_forks = impact(capsys, str(candidate), "--action", "fork")
    assert (only_forks["evaluated"], only_forks["changed"]) == (1, 0)
