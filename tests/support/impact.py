"""`sessionstate policy impact` as the impact tests run it: against a stopped service's data
dir, with the real OPA, its JSON report read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.cli import main


def impact_env(monkeypatch: pytest.MonkeyPatch, data_dir: Path, opa_bin: str) -> Path:
    """The environment the command reads the store of `data_dir` in (the embedded LevelDB)."""
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("SESSIONSTATE_OPA_BIN", opa_bin)
    monkeypatch.delenv("SESSIONSTATE_STORE", raising=False)
    return data_dir


def impact(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """The exit code and the JSON report (empty unless the code is 0 or 3)."""
    code = main(["policy", "impact", *argv, "--format", "json", "--examples", "100"])
    out = capsys.readouterr().out
    return code, json.loads(out) if code in (0, 3) else {}
