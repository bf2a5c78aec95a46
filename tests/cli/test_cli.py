"""The `sessionstate` command line."""

from __future__ import annotations

from pathlib import Path

import jwt
import pytest

from service.auth.tokens import TokenVerifier
from service.cli import main
from store.secrets import local_secret


def test_token_mints_with_the_local_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("SESSIONSTATE_JWT_SECRET", raising=False)
    argv = ["token", "--sub", "svc", "--role", "model-service", "--tenant", "t", "--workspace", "w"]
    assert main([*argv, "--session", "s", "--ttl", "60"]) == 0
    token = capsys.readouterr().out.strip()
    actor = TokenVerifier(local_secret(tmp_path, "jwt.secret")).verify(f"Bearer {token}")
    assert (actor.sub, actor.roles) == ("svc", ("model-service",))
    assert (actor.tenant_id, actor.workspace_id, actor.session_id) == ("t", "w", "s")


def test_token_refuses_an_unknown_role(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["token", "--sub", "x", "--role", "admin"])
    assert "invalid choice" in capsys.readouterr().err


def test_a_short_configured_secret_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SESSIONSTATE_JWT_SECRET", "short")
    assert main(["token", "--sub", "x", "--role", "operator"]) == 2
    err = capsys.readouterr().err
    assert "SESSIONSTATE_JWT_SECRET must be at least 32 bytes" in err
    assert "short" not in err.replace("SESSIONSTATE_JWT_SECRET", "")


def _token_argv(*extra: str) -> list[str]:
    return ["token", "--sub", "svc", "--role", "auditor", "--tenant", "t", *extra]


def test_token_refuses_a_ttl_over_the_maximum_lifetime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS", "600")
    assert main(_token_argv("--ttl", "601")) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS" in err
    assert main(_token_argv("--ttl", "600")) == 0


def test_token_refuses_a_ttl_over_the_default_maximum_of_a_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS", raising=False)
    assert main(_token_argv("--ttl", "86401")) == 2
    assert "SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS (86400)" in capsys.readouterr().err


def test_token_default_ttl_fits_a_lower_maximum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS", "120")
    assert main(_token_argv()) == 0
    claims = jwt.decode(capsys.readouterr().out.strip(), options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 120


@pytest.mark.parametrize("value", ["59", "31536001", "a-day"])
def test_a_bad_maximum_lifetime_is_named_not_echoed(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS", value)
    assert main(_token_argv()) == 2
    err = capsys.readouterr().err
    assert err.startswith("sessionstate: invalid setting: SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS")
    assert err.count("\n") == 1 and value not in err
