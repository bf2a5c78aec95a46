"""A damaged or busy store is named as such, in one line, and `repair` says what it dropped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import plyvel
import pytest

from store.backends.leveldb import LevelDBLaneStore
from store.embedded.integrity import REPAIR_ADVICE, StoreBusy, StoreCorrupt, StoreUnavailable
from store.embedded.repair import repair
from store.key_codec import TenantResourceLane
from tests.support.damage import (
    CANARY,
    build_store,
    flip,
    into_table,
    newest_log,
    record_offsets,
    set_record_type,
)


def refused(path: Path, kind: type[StoreUnavailable], **options: bool) -> str:
    """The open fails with kind; its message, checked for what no message may hold."""
    with pytest.raises(StoreUnavailable) as caught:
        LevelDBLaneStore(path, **options)
    assert type(caught.value) is kind
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    assert "b'" not in message and 'b"' not in message
    assert CANARY not in message
    if kind is StoreCorrupt:
        assert "corrupt" in message and message.endswith(REPAIR_ADVICE)
    return message


def test_an_empty_current_file_is_corrupt(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    (tmp_path / "db" / "CURRENT").write_bytes(b"")
    assert "CURRENT file is empty or damaged" in refused(tmp_path / "db", StoreCorrupt)


def test_a_missing_current_file_is_corrupt_and_the_tables_are_kept(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    table = into_table(tmp_path / "db")
    (tmp_path / "db" / "CURRENT").unlink()
    # LevelDB alone would start a new database over the old one and delete its tables.
    assert "CURRENT file is missing" in refused(tmp_path / "db", StoreCorrupt)
    assert table.exists()


def test_a_flipped_byte_in_a_table_is_corrupt_once_every_block_is_read(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    flip(into_table(tmp_path / "db"), 50)  # inside the first data block
    message = refused(tmp_path / "db", StoreCorrupt, read_every_block=True)
    assert "a table block fails its checksum" in message


def test_a_flipped_byte_in_the_log_is_corrupt(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    log = newest_log(tmp_path / "db")
    flip(log, record_offsets(log.read_bytes())[2] + 20)  # a payload byte of the third write
    assert "log or MANIFEST record fails its checksum" in refused(tmp_path / "db", StoreCorrupt)


def test_a_truncated_table_is_corrupt(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    table = into_table(tmp_path / "db")
    table.write_bytes(table.read_bytes()[:100])
    message = refused(tmp_path / "db", StoreCorrupt)
    assert f"table file {table.name} is truncated or overwritten" in message


def test_a_store_held_in_this_process_is_busy(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    held = plyvel.DB(str(tmp_path / "db"))
    try:
        assert "LOCK is held" in refused(tmp_path / "db", StoreBusy)
    finally:
        held.close()


HOLDER = """
import sys, plyvel
db = plyvel.DB(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


def test_a_store_held_by_another_process_is_busy(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused(tmp_path / "db", StoreBusy)
        with pytest.raises(StoreBusy):
            repair(tmp_path / "db")
    finally:
        holder.kill()
        holder.wait()


def test_a_path_that_is_a_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "db").write_text("not a directory")
    assert "cannot be opened" in refused(tmp_path / "db", StoreUnavailable)


def test_repair_reports_a_dropped_log_record_and_leaves_a_store_that_opens(
    tmp_path: Path,
) -> None:
    database = tmp_path / "db"
    build_store(database, chain_entries=5, sessions=5)
    set_record_type(newest_log(database), 7, 9)  # the third session record
    refused(database, StoreCorrupt)

    report = repair(database)

    assert report.records_before is None  # it did not open
    (drop,) = report.repair.log_drops
    assert drop.reason == "unknown_record_type" and drop.bytes > 0
    assert report.repair.dropped_log_bytes == drop.bytes
    assert report.dropped
    # 5 entries, the chain's marker and its tree's (5 leaves, 3 inner nodes, tree_key), 4 sessions
    assert report.repair.log_operations_recovered == 19
    assert report.records_after is not None
    assert report.records_after[TenantResourceLane.SESSION_STATE] == 4
    assert report.records_after[TenantResourceLane.TRACE_EVIDENCE] == 5
    assert report.chain is not None and report.chain.ok and report.ok
    assert CANARY not in report.model_dump_json()
    LevelDBLaneStore(database, read_every_block=True).close()


def test_repair_that_drops_a_decision_shows_the_gap_in_the_chain(tmp_path: Path) -> None:
    database = tmp_path / "db"
    build_store(database, chain_entries=5, sessions=0)
    set_record_type(newest_log(database), 2, 9)  # decision 3 of 5
    report = repair(database)
    assert report.repair.log_drops[0].reason == "unknown_record_type"
    assert report.chain is not None
    assert (report.chain.problem, report.chain.first_invalid_seq) == ("seq_gap", 3)
    assert not report.ok


def test_repair_keeps_what_a_damaged_table_still_holds(tmp_path: Path) -> None:
    database = tmp_path / "db"
    build_store(database, chain_entries=40, sessions=40)  # several table blocks
    LevelDBLaneStore(database).close()  # the records go from the log into a table
    before = repair(database).records_after
    flip(into_table(database), 50)

    report = repair(database)

    assert report.records_before is None  # a block fails its checksum
    (damage,) = report.repair.damaged_tables
    assert damage.reason == "block_checksum_mismatch"
    assert damage.table_file in report.repair.archived_files
    assert report.dropped and report.ok  # the chain's entries were in blocks that still read
    assert report.records_after is not None and before is not None
    assert sum(report.records_after.values()) == damage.entries_kept < sum(before.values())
    LevelDBLaneStore(database, read_every_block=True).close()


def test_repair_counts_log_records_that_fail_their_checksum_which_leveldb_keeps(
    tmp_path: Path,
) -> None:
    database = tmp_path / "db"
    build_store(database, chain_entries=0, sessions=3)
    log = newest_log(database)
    flip(log, record_offsets(log.read_bytes())[1] + 40)  # a value byte of the second record
    refused(database, StoreCorrupt)

    report = repair(database)

    assert report.log_records_failing_checksum == 1
    assert report.repair.log_drops == [] and not report.dropped  # LevelDB's repairer kept it
    assert report.records_after is not None
    assert report.records_after[TenantResourceLane.SESSION_STATE] == 3


def test_repair_of_a_healthy_store_counts_the_same_before_and_after(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    report = repair(tmp_path / "db")
    assert report.records_before == report.records_after
    assert report.repair.log_drops == [] and report.repair.damaged_tables == []
    assert not report.dropped and report.log_records_failing_checksum == 0
    assert report.ok


def test_repair_is_refused_while_the_store_is_open(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    held = plyvel.DB(str(tmp_path / "db"))
    try:
        with pytest.raises(StoreBusy):
            repair(tmp_path / "db")
    finally:
        held.close()
    assert not (tmp_path / "db" / "lost").exists()
