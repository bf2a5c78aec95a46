"""Records stored before sessions had a meta key are dated by `db upgrade`, so idle expiry
sees them (issue 29): on LevelDB and PostgreSQL, a record without one gets `updated_at` =
the upgrade; one written since keeps its own time; a second run dates nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.cli import main
from store.backends.contract import Lanes
from store.backends.leveldb import LevelDBLaneStore
from store.key_codec import LaneKey, TenantResourceLane
from store.meta_scan import meta_page
from store.scope import TenantScope
from store.session_data import meta_key, read_meta, written_meta
from store.session_dating import date_undated_sessions

UPGRADED_AT = "2026-12-01T12:00:00.000000Z"
WRITTEN_AT = "2026-11-30T08:00:00.000000Z"


def scope(session: str, tenant: str = "t-a") -> TenantScope:
    return TenantScope(tenant_id=tenant, workspace_id="w-1", session_id=session)


def stored_record(lanes: Lanes, where: TenantScope) -> None:
    """A record's key as an older release left it (the bytes do not matter here)."""
    key = LaneKey(
        TenantResourceLane.SESSION_STATE, where.tenant_id, where.workspace_id, where.session_id
    )
    lanes.put(key, b"{}")


def test_undated_records_are_dated_at_the_upgrade_and_dated_ones_keep_their_time(
    lanes_on_both: Lanes,
) -> None:
    old = [scope("s-1"), scope("s-2"), scope("s-1", tenant="t-b")]
    for each in old:
        stored_record(lanes_on_both, each)
    recent = scope("s-3")
    stored_record(lanes_on_both, recent)
    lanes_on_both.put(meta_key(recent), written_meta(WRITTEN_AT))

    assert date_undated_sessions(lanes_on_both, UPGRADED_AT) == 3
    for each in old:
        meta = read_meta(lanes_on_both, each)
        assert meta is not None and meta.updated_at == UPGRADED_AT
    kept = read_meta(lanes_on_both, recent)
    assert kept is not None and kept.updated_at == WRITTEN_AT
    found, _ = meta_page(lanes_on_both, None, 10)  # what the sweep walks
    assert {item.scope for item in found} == {*old, recent}
    assert date_undated_sessions(lanes_on_both, UPGRADED_AT) is None  # again: nothing to do


def test_db_upgrade_says_how_many_it_dated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "var"
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    try:
        stored_record(lanes, scope("s-1"))
    finally:
        lanes.close()
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    monkeypatch.delenv("SESSIONSTATE_STORE", raising=False)
    assert main(["db", "upgrade"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["sessions_dated"], first["changed"]) == (1, True)
    assert main(["db", "upgrade"]) == 0
    assert json.loads(capsys.readouterr().out)["sessions_dated"] is None
