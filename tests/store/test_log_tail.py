"""Bytes LevelDB drops silently from the end of its write-ahead log are measured and reported."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import requests

from store.backends.leveldb import LevelDBLaneStore
from store.embedded.log_tail import (
    UNREPORTED_FILE,
    checksum_failures,
    crc32c,
    log_mark,
    may_have_landed,
    torn_log_tail,
    torn_tail_length,
)
from store.key_codec import LaneKey, TenantResourceLane
from tests.support.damage import BLOCK, CANARY, build_store, newest_log
from tests.support.served import start

TORN_RECORD = b"\x8a\x11\x02\x7f" + (100).to_bytes(2, "little") + b"\x01" + b"x" * 20


def session_keys(path: Path) -> int:
    lanes = LevelDBLaneStore(path)
    try:
        return lanes.count(TenantResourceLane.SESSION_STATE)
    finally:
        lanes.close()


def append(file: Path, data: bytes) -> None:
    with open(file, "ab") as handle:
        handle.write(data)


def test_a_log_of_whole_records_has_no_torn_tail(tmp_path: Path) -> None:
    assert torn_log_tail(tmp_path) == 0  # no log at all
    build_store(tmp_path / "db")
    assert torn_log_tail(tmp_path / "db") == 0
    assert torn_tail_length(b"") == 0


def test_a_torn_record_is_measured_exactly_and_dropped_by_the_open(tmp_path: Path) -> None:
    database = tmp_path / "db"
    build_store(database, sessions=5)
    log = newest_log(database)
    assert log.stat().st_size % BLOCK + len(TORN_RECORD) < BLOCK  # within the last block
    append(log, TORN_RECORD)
    assert torn_log_tail(database) == len(TORN_RECORD) == 27

    lanes = LevelDBLaneStore(database)
    assert lanes.dropped_log_bytes == 27
    assert lanes.count(TenantResourceLane.SESSION_STATE) == 5  # every whole record was kept
    lanes.close()
    assert torn_log_tail(database) == 0  # LevelDB rewrote its log: the bytes are gone


def test_a_failed_write_may_have_landed_only_when_its_record_is_whole_in_the_log(
    tmp_path: Path,
) -> None:
    """How a failed write's outcome is told (store.backends.leveldb): nothing appended, or a torn record,
    is nothing done; a whole record (only the sync failed) may be replayed by the next open."""
    database = tmp_path / "db"
    build_store(database)
    before = log_mark(database)
    assert not may_have_landed(database, before)  # the write appended nothing
    append(newest_log(database), TORN_RECORD)
    assert not may_have_landed(database, before)  # torn: the next open drops it
    lanes = LevelDBLaneStore(database)  # the open drops the torn record and starts a new log
    try:
        before = log_mark(database)
        lanes.put(LaneKey(TenantResourceLane.SESSION_STATE, "t", "w", "s"), b"whole")
        assert may_have_landed(database, before)  # the record is whole: it may show up
    finally:
        lanes.close()


def test_a_header_cut_short_is_measured(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    append(newest_log(tmp_path / "db"), TORN_RECORD[:3])
    assert torn_log_tail(tmp_path / "db") == 3
    assert session_keys(tmp_path / "db") == 5


def test_zeros_at_the_end_of_the_log_are_measured(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    append(newest_log(tmp_path / "db"), bytes(1000))  # what a file system may leave after a crash
    assert torn_log_tail(tmp_path / "db") == 1000
    assert session_keys(tmp_path / "db") == 5


def test_a_record_whose_last_fragment_never_came_is_dropped_whole(tmp_path: Path) -> None:
    database = tmp_path / "db"
    build_store(database, sessions=5)
    lanes = LevelDBLaneStore(database)  # the old log goes into a table; a new log begins
    lanes.put(LaneKey(TenantResourceLane.SESSION_STATE, CANARY, "ws", "big"), b"v" * 70_000)
    lanes.close()
    log = newest_log(database)
    kept = log.read_bytes()
    # The new log starts with the big record: FIRST, MIDDLE, LAST fragments over three blocks.
    assert len(kept) > 2 * BLOCK
    log.write_bytes(kept[: 2 * BLOCK + 100])  # the LAST fragment is cut short
    assert torn_log_tail(database) == 2 * BLOCK + 100  # from the FIRST fragment on
    assert session_keys(database) == 5  # LevelDB dropped the big record, and said nothing


def test_a_damaged_record_is_not_a_torn_tail(tmp_path: Path) -> None:
    build_store(tmp_path / "db")
    log = newest_log(tmp_path / "db")
    data = bytearray(log.read_bytes())
    data[6] = 9  # an unknown type: LevelDB reports corruption instead of dropping quietly
    assert torn_tail_length(bytes(data)) == 0


def test_checksums_are_leveldbs_crc32c(tmp_path: Path) -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    build_store(tmp_path / "db", sessions=5)
    log = newest_log(tmp_path / "db").read_bytes()
    assert checksum_failures(log) == 0
    damaged = bytearray(log)
    damaged[-3] ^= 0x01
    assert checksum_failures(bytes(damaged)) == 1


def test_a_drop_stays_unreported_until_acknowledged(tmp_path: Path) -> None:
    database = tmp_path / "db"
    build_store(database)
    append(newest_log(database), TORN_RECORD)
    LevelDBLaneStore(database).close()  # an offline review, say, opened it first
    lanes = LevelDBLaneStore(database)
    assert lanes.dropped_log_bytes == 27  # carried to the next open
    lanes.acknowledge_dropped_log_bytes()
    assert lanes.dropped_log_bytes == 0
    lanes.close()
    assert not (database / UNREPORTED_FILE).exists()
    again = LevelDBLaneStore(database)
    assert again.dropped_log_bytes == 0
    again.close()


def test_the_served_service_logs_and_counts_a_torn_log_tail(opa_bin: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    build_store(data_dir / "leveldb")
    append(newest_log(data_dir / "leveldb"), TORN_RECORD)

    served = start(opa_bin, data_dir, tmp_path)
    try:
        metrics = requests.get(served.url + "/metrics", timeout=5).text
        assert "sessionstate_store_log_bytes_dropped_total 27.0" in metrics.splitlines()
    finally:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(20)
    events = [
        json.loads(line)
        for line in served.log.read_text().splitlines()
        if line.startswith("{") and "store_log_tail_dropped" in line
    ]
    assert len(events) == 1
    assert events[0]["level"] == "error" and events[0]["dropped_bytes"] == 27
    assert not (data_dir / "leveldb" / UNREPORTED_FILE).exists()
