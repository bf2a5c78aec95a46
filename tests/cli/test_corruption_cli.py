"""`sessionstate serve`, `decisions` and `db repair` on a corrupt or busy store."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import plyvel
import pytest

from service.cli import main
from store.backends.leveldb import LevelDBLaneStore
from store.embedded.integrity import REPAIR_ADVICE
from tests.support.damage import CANARY, build_store, flip, into_table, newest_log, set_record_type
from tests.support.live import DIGEST_KEY, JWT_SECRET
from tests.support.served import ROOT, free_port


def empty_current(database: Path) -> None:
    (database / "CURRENT").write_bytes(b"")


def truncated_table(database: Path) -> None:
    table = into_table(database)
    table.write_bytes(table.read_bytes()[:100])


def flipped_table_byte(database: Path) -> None:
    flip(into_table(database), 50)


def flipped_log_byte(database: Path) -> None:
    flip(newest_log(database), 100)


DAMAGE = [empty_current, truncated_table, flipped_table_byte, flipped_log_byte]


def damaged_data_dir(tmp_path: Path, damage: Callable[[Path], None] | None = None) -> Path:
    data_dir = tmp_path / "var"
    build_store(data_dir / "leveldb")
    if damage is not None:
        damage(data_dir / "leveldb")
    return data_dir


@pytest.mark.parametrize("damage", DAMAGE)
def test_serve_on_a_corrupt_store_is_one_line_and_exit_2(
    damage: Callable[[Path], None], opa_bin: str, tmp_path: Path
) -> None:
    data_dir = damaged_data_dir(tmp_path, damage)
    env = {
        **os.environ,
        "SESSIONSTATE_DATA_DIR": str(data_dir),
        "SESSIONSTATE_PORT": str(free_port()),
        "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
        "SESSIONSTATE_OPA_BIN": opa_bin,
    }
    refused = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert line.startswith(f"sessionstate: the store at {data_dir / 'leveldb'} is corrupt (")
    assert line.endswith(REPAIR_ADVICE)
    assert "Traceback" not in refused.stderr and CANARY not in refused.stderr
    assert "b'" not in refused.stderr
    assert not (data_dir / "opa").exists()  # nothing was started


def test_decisions_verify_on_a_corrupt_store_says_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(damaged_data_dir(tmp_path, empty_current)))
    assert main(["decisions", "verify"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert "is corrupt (its CURRENT file is empty or damaged)" in line
    assert "sessionstate db repair" in line and "stop the service" not in line


def test_decisions_on_a_busy_store_say_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = damaged_data_dir(tmp_path)
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    held = plyvel.DB(str(data_dir / "leveldb"))
    try:
        for command in (["verify"], ["export"], ["tail"], ["checkpoint"]):
            assert main(["decisions", *command]) == 2
            (line,) = capsys.readouterr().err.splitlines()
            assert "stop the service first, or review a copy of the data dir" in line
            assert "corrupt" not in line
    finally:
        held.close()


def test_db_repair_reports_the_dropped_log_record_and_the_store_opens_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = damaged_data_dir(tmp_path)
    set_record_type(newest_log(data_dir / "leveldb"), 7, 9)  # a session record, not a decision
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["decisions", "verify"]) == 2
    assert "is corrupt" in capsys.readouterr().err

    assert main(["db", "repair"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["repair"]["log_drops"][0]["reason"] == "unknown_record_type"
    assert report["repair"]["dropped_log_bytes"] > 0 and report["dropped"] is True
    assert report["records_after"]["session_state"] == 4
    assert report["chain"]["ok"] is True and report["ok"] is True
    LevelDBLaneStore(data_dir / "leveldb").close()
    assert main(["decisions", "verify"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 5


def test_db_repair_exits_1_when_the_chain_lost_a_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = damaged_data_dir(tmp_path)
    set_record_type(newest_log(data_dir / "leveldb"), 1, 9)  # decision 2
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["db", "repair"]) == 1
    chain = json.loads(capsys.readouterr().out)["chain"]
    assert (chain["problem"], chain["first_invalid_seq"]) == ("seq_gap", 2)


def test_db_repair_is_refused_while_the_store_or_the_data_dir_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = damaged_data_dir(tmp_path)
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    held = plyvel.DB(str(data_dir / "leveldb"))
    try:
        assert main(["db", "repair"]) == 2
        assert "is in use" in capsys.readouterr().err
    finally:
        held.close()
    with open(data_dir / "sessionstate.lock", "a") as service_lock:
        fcntl.flock(service_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running service holds
        assert main(["db", "repair"]) == 2
        assert "is in use" in capsys.readouterr().err
    assert not (data_dir / "leveldb" / "lost").exists()  # nothing was repaired


def test_db_repair_without_a_database_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(tmp_path / "empty"))
    assert main(["db", "repair"]) == 2
    assert "no sessionstate database under" in capsys.readouterr().err
