"""The `sessionstate` command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.auth import TokenVerifier
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
