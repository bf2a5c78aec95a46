"""`sessionstate policy impact`: a candidate policy set replayed over the logged decisions,
on a real OPA of its own, from the real store (read-only) or an export."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from service.cli import main
from service.decisions.reader import DecisionLogReader
from service.policy.sidecar import OpaSidecar
from store.backends.leveldb import LevelDBLaneStore
from store.backends.postgres import read_only_conninfo
from tests.support.factories import state_input
from tests.support.impact import impact, impact_env
from tests.support.live import LiveService, live_service, service_settings
from tests.support.paths import POLICY_DIR
from tests.support.served import Served

APPROVAL_GATE = (
    '_store_reasons contains "session_state_operator_approval_missing" '
    "if not _approval_covers_target\n"
)
FIELDS = {
    "candidate_revision",
    "evaluated",
    "unchanged",
    "changed",
    "allow_gained",
    "allow_lost",
    "reasons_changed",
    "skipped",
    "by_action",
    "by_reason",
    "by_tenant",
    "examples",
}


def _put(service: LiveService, session: str = "chat-1", tenant: str = "tenant-a") -> int:
    path = service.session_path(t=tenant, s=session) + "/state"
    token = service.token(tenant=tenant, session="chat-1")
    answer = service.call("PUT", path, token, json=state_input())
    return answer.status_code


@pytest.fixture(scope="module")
def logged(sidecar: OpaSidecar, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stopped service's data dir: denied writes (no approval, another session), approved
    ones, reads, previews, approvals, for two tenants."""
    data_dir = tmp_path_factory.mktemp("impact") / "var"
    with live_service(sidecar, service_settings(data_dir)) as service:
        assert _put(service) == 403  # no approval yet
        assert _put(service, tenant="tenant-b") == 403
        assert _put(service, session="chat-2") == 403  # another session: stays denied
        preview = service.session_path() + "/state/preview"
        assert service.call("POST", preview, service.token(), json=state_input()).status_code == 200
        service.approve()
        assert _put(service) == 201
        assert service.call("GET", service.session_path() + "/state", service.token()).ok
    return data_dir


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, logged: Path, opa_bin: str) -> Path:
    return impact_env(monkeypatch, logged, opa_bin)


@pytest.fixture(scope="module")
def ungated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The live policies without the operator-approval gate for writes."""
    candidate = tmp_path_factory.mktemp("candidate") / "policies"
    shutil.copytree(POLICY_DIR, candidate)
    write = candidate / "sessionstate" / "write" / "write.rego"
    text = write.read_text()
    assert APPROVAL_GATE in text
    write.write_text(text.replace(APPROVAL_GATE, ""))
    return candidate


@pytest.fixture(scope="module")
def export(logged: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole log as `sessionstate decisions export` writes it."""
    out = tmp_path_factory.mktemp("export") / "decisions.ndjson"
    with _reader(logged) as reader:
        out.write_text("".join(reader.export(None)))
    return out


@contextmanager
def _reader(data_dir: Path) -> Iterator[DecisionLogReader]:
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    try:
        yield DecisionLogReader(lanes)
    finally:
        lanes.close()


def _denied_for_approval_only(data_dir: Path) -> set[str]:
    with _reader(data_dir) as reader:
        return {
            entry.decision.decision_id
            for name in reader.chains()
            for entry in reader.entries(name)
            if entry.decision.action == "write"
            and entry.decision.reasons == ["session_state_operator_approval_missing"]
        }


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_a_candidate_without_the_approval_gate_gains_allow_on_exactly_the_denied_writes(
    env: Path, ungated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    denied = _denied_for_approval_only(env)
    assert len(denied) == 2
    before = _tree_digest(env)
    code, report = impact(capsys, str(ungated))
    assert code == 0
    assert set(report) == FIELDS
    assert report["allow_gained"] == 2
    assert report["allow_lost"] == 0
    gained = {
        example["decision_id"]
        for example in report["examples"]
        if not example["before"]["allow"] and example["after"]["allow"]
    }
    assert gained == denied
    assert report["by_action"]["write"]["allow_gained"] == 2
    assert report["by_tenant"]["tenant-b"]["allow_gained"] == 1
    # the preview and the cross-session write lose the approval reason but keep their allow
    assert report["reasons_changed"] == 2
    assert report["by_reason"]["session_state_operator_approval_missing"]["lost"] == 4
    assert report["changed"] == report["allow_gained"] + report["reasons_changed"]
    assert report["evaluated"] == report["changed"] + report["unchanged"]
    assert _tree_digest(env) == before  # the store is read, never written


def test_fail_on_allow_gained_exits_3_when_allow_is_gained(
    env: Path, ungated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = impact(capsys, str(ungated), "--fail-on", "allow-gained")
    assert code == 3
    assert report["allow_gained"] == 2


def test_the_live_policies_as_candidate_change_nothing(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = impact(capsys, str(POLICY_DIR), "--fail-on", "allow-gained")
    assert code == 0
    assert report["changed"] == 0
    assert report["evaluated"] == report["unchanged"] > 0
    assert report["examples"] == []


def test_an_export_gives_the_same_report_as_the_store(
    env: Path, ungated: Path, export: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, from_store = impact(capsys, str(ungated))
    code, from_export = impact(capsys, str(ungated), "--decisions", str(export))
    assert code == 0
    assert from_export == from_store
    code, live = impact(capsys, str(POLICY_DIR), "--decisions", str(export), "--fail-on", "any")
    assert (code, live["changed"]) == (0, 0)
    code, _ = impact(capsys, str(ungated), "--decisions", str(export), "--fail-on", "allow-gained")
    assert code == 3


def test_filters_select_by_tenant_and_action(
    env: Path, ungated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, report = impact(capsys, str(ungated), "--tenant", "tenant-b", "--action", "write")
    assert (report["evaluated"], report["allow_gained"]) == (1, 1)
    assert set(report["by_tenant"]) == {"tenant-b"}
    _, none = impact(capsys, str(ungated), "--since", "2999-01-01T00:00:00Z")
    assert none["evaluated"] == 0


def test_a_broken_candidate_exits_2_without_a_report(
    env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, broken)
    write = broken / "sessionstate" / "write" / "write.rego"
    write.write_text(write.read_text() + "\n_unused if input.record.no_such_field\n")
    assert main(["policy", "impact", str(broken), "--fail-on", "allow-gained"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "does not pass `opa check --strict`" in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--since", "yesterday"], "--since: an RFC 3339 time"),
        (["--decisions", "/nonexistent/export.ndjson"], "is not a file"),
        (["--action", "delete-everything"], "--action"),
    ],
)
def test_bad_usage_exits_2_with_a_clear_message(
    env: Path, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "impact", str(POLICY_DIR), *argv]) == 2
    captured = capsys.readouterr()
    assert said in captured.err
    assert "Traceback" not in captured.err
    assert "delete-everything" not in captured.err


def test_a_missing_candidate_exits_2(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "impact", "/nonexistent/policies"]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_an_unreadable_export_line_is_named_not_echoed(
    env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "bad.ndjson"
    export.write_text('{"secret-looking": "value"}\n')
    assert main(["policy", "impact", str(POLICY_DIR), "--decisions", str(export)]) == 2
    err = capsys.readouterr().err
    assert "line 1 of" in err
    assert "secret-looking" not in err


def test_text_and_markdown_reports(
    env: Path, ungated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "impact", str(ungated)]) == 0
    text = capsys.readouterr().out
    assert "allow gained (deny -> allow)" in text
    assert main(["policy", "impact", str(ungated), "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("### Policy impact")
    assert "| allow gained (deny -> allow) | `2` |" in markdown


def test_inputs_of_an_older_schema_are_skipped_and_counted(
    env: Path, export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = export.read_text().splitlines()
    event = json.loads(lines[0])
    event["sessionstate"]["input"]["retired_field"] = 1
    del event["sessionstate"]["input"]["deployment"]
    older = tmp_path / "older.ndjson"
    older.write_text("\n".join([json.dumps(event), *lines[1:]]) + "\n")
    _, report = impact(capsys, str(POLICY_DIR), "--decisions", str(older))
    assert report["skipped"] == {"total": 1, "why": {"input_schema_outdated": 1}}
    assert report["evaluated"] == len(lines) - 1


def _rows(conninfo: str) -> str:
    with psycopg.connect(conninfo) as connection:
        rows = connection.execute(
            "SELECT tenant_id, key, value FROM sessionstate_lanes ORDER BY tenant_id, key"
        ).fetchall()
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def test_on_postgresql_the_store_is_read_over_read_only_transactions(
    sidecar: OpaSidecar,
    postgres_conninfo: str,
    ungated: Path,
    tmp_path: Path,
    opa_bin: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = service_settings(tmp_path / "var", store=postgres_conninfo)
    with live_service(sidecar, settings) as service:
        assert _put(service) == 403
        assert service.call("GET", service.session_path() + "/state", service.token()).ok is False
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("SESSIONSTATE_STORE", postgres_conninfo)
    monkeypatch.setenv("SESSIONSTATE_OPA_BIN", opa_bin)
    before = _rows(postgres_conninfo)
    code, report = impact(capsys, str(ungated), "--fail-on", "allow-gained")
    assert (code, report["evaluated"], report["allow_gained"]) == (3, 2, 1)
    assert _rows(postgres_conninfo) == before
    with (
        psycopg.connect(read_only_conninfo(postgres_conninfo)) as connection,
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
    ):
        connection.execute("DELETE FROM sessionstate_lanes")


def test_a_leveldb_a_running_service_holds_is_not_read(
    served: Served,
    opa_bin: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(served.data_dir))
    monkeypatch.setenv("SESSIONSTATE_OPA_BIN", opa_bin)
    monkeypatch.delenv("SESSIONSTATE_STORE", raising=False)
    assert main(["policy", "impact", str(POLICY_DIR)]) == 2
    err = capsys.readouterr().err
    assert "holds it" in err and "--decisions" in err


def test_a_data_only_candidate_is_analysed_like_a_rego_change(
    env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the tenant settings document changes: tenant-a's model services may no longer
    write durably. Exactly tenant-a's allowed writes lose allow; tenant-b is untouched."""
    candidate = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, candidate)
    settings = candidate / "sessionstate" / "tenants" / "data.json"
    settings.write_text(
        json.dumps({"settings": [{"tenant_id": "tenant-a", "durable_writes": False}]})
    )
    code, report = impact(capsys, str(candidate), "--fail-on", "allow-lost")
    assert code == 3
    with _reader(env) as reader:
        allowed_writes = {
            entry.decision.decision_id
            for name in reader.chains()
            for entry in reader.entries(name)
            if entry.decision.action == "write" and entry.decision.allow
        }
    assert allowed_writes and report["allow_lost"] == len(allowed_writes)
    assert report["allow_gained"] == 0
    assert {example["decision_id"] for example in report["examples"]} >= allowed_writes
    assert report["by_tenant"].get("tenant-b", {}).get("changed", 0) == 0
