"""`SessionStateStore` on a real LevelDB: reads fail closed, writes compare-and-set."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_json, sha256_digest
from store.digests import DigestKey
from store.embedded.integrity import StoreBusy
from store.key_codec import LaneKey, TenantResourceLane
from store.record.blockers import CorruptionLabel
from store.record.state_record import compute_state_digest
from store.session_state import Precondition, PreconditionFailed, SessionStateStore, state_key
from tests.store.test_lane_store_contract import run_compare_and_set
from tests.support.factories import record, scope
from tests.support.paths import ROOT

CANARY = "CORRUPT-CANARY-7f3a"


def test_nothing_stored_reads_as_none(state_store: SessionStateStore) -> None:
    assert state_store.read(scope()) is None


def test_written_record_reads_back_whole(
    state_store: SessionStateStore, digest_key: DigestKey
) -> None:
    built = record(digest_key)
    written = state_store.write(built)
    report = state_store.read(scope())
    assert written.created is True
    assert report is not None
    assert report.record == built
    assert report.corrupt is False
    assert report.redacted_error is None and report.error_digest is None
    assert report.raw_payload_exposed is False
    assert report.key_digest == written.key_digest == state_key(built.scope).digest()


def test_records_are_stored_as_canonical_json(
    state_store: SessionStateStore, lanes: LevelDBLaneStore, digest_key: DigestKey
) -> None:
    built = record(digest_key)
    state_store.write(built)
    assert lanes.get(state_key(built.scope)) == canonical_json(built.to_json())


def test_scopes_do_not_share_records(state_store: SessionStateStore, digest_key: DigestKey) -> None:
    state_store.write(record(digest_key, scope("Tenant_A")))
    assert state_store.read(scope("tenant_a")) is None


def test_if_none_match_creates_only(state_store: SessionStateStore, digest_key: DigestKey) -> None:
    create_only = Precondition(if_none_match_any=True)
    state_store.write(record(digest_key), create_only)
    with pytest.raises(PreconditionFailed):
        state_store.write(record(digest_key, state_id="state-2"), create_only)


def test_if_match_replaces_only_that_version(
    state_store: SessionStateStore, digest_key: DigestKey
) -> None:
    first = record(digest_key)
    state_store.write(first)
    second = record(digest_key, state_id="state-2")
    with pytest.raises(PreconditionFailed):
        state_store.write(second, Precondition(if_match="sha256:" + "0" * 64))
    replaced = state_store.write(second, Precondition(if_match=first.state_digest))
    assert replaced.created is False
    with pytest.raises(PreconditionFailed):
        state_store.write(first, Precondition(if_match=first.state_digest))


def test_if_match_on_nothing_stored_fails(
    state_store: SessionStateStore, digest_key: DigestKey
) -> None:
    built = record(digest_key)
    with pytest.raises(PreconditionFailed):
        state_store.write(built, Precondition(if_match=built.state_digest))
    assert state_store.read(scope()) is None


def test_records_with_blockers_are_never_stored(
    state_store: SessionStateStore, digest_key: DigestKey
) -> None:
    with pytest.raises(ValueError, match="session_state_gene_anchor_missing"):
        state_store.write(record(digest_key, gene_anchors=[]))
    assert state_store.read(scope()) is None


def test_extra_keys_commit_in_the_same_batch(
    state_store: SessionStateStore, lanes: LevelDBLaneStore, digest_key: DigestKey
) -> None:
    evidence = LaneKey(TenantResourceLane.TRACE_EVIDENCE, name=b"\x00" * 7 + b"\x01")
    state_store.write(record(digest_key), also=[(evidence, b"entry")])
    assert lanes.get(evidence) == b"entry"


def test_a_failed_batch_writes_nothing(lanes: LevelDBLaneStore) -> None:
    first = LaneKey(TenantResourceLane.APPROVAL_PACKET, "t", "w", name=b"a")
    second = LaneKey(TenantResourceLane.APPROVAL_PACKET, "t", "w", name=b"b")
    with pytest.raises(RuntimeError), lanes.batch() as batch:
        batch.put(first, b"1")
        batch.put(second, b"2")
        raise RuntimeError("interrupted")
    assert lanes.get(first) is None and lanes.get(second) is None


def _corrupt_with(lanes: LevelDBLaneStore, digest_key: DigestKey, stored: bytes) -> None:
    lanes.put(state_key(scope()), stored)


def _tampered(digest_key: DigestKey, **change: object) -> bytes:
    body = record(digest_key).to_json() | change
    return canonical_json(body)


def _redigested(digest_key: DigestKey, **change: object) -> bytes:
    """A tampered record whose state digest was recomputed to match: only validation catches it."""
    body = record(digest_key).to_json() | change
    content = {k: v for k, v in body.items() if k != "state_digest"}
    return canonical_json(content | {"state_digest": compute_state_digest(content)})


@pytest.mark.parametrize(
    ("make_bytes", "label"),
    [
        (lambda k: CANARY.encode() + b"\xff\xfe not json", CorruptionLabel.MALFORMED),
        (lambda k: ('{"note": "' + CANARY + '"').encode(), CorruptionLabel.MALFORMED),
        (lambda k: b"[" * 100_000, CorruptionLabel.MALFORMED),
        (lambda k: json.dumps({"schema": CANARY}).encode(), CorruptionLabel.SCHEMA_MISMATCH),
        (lambda k: _tampered(k, extra=CANARY), CorruptionLabel.SCHEMA_MISMATCH),
        (lambda k: _tampered(k, state_id="state-" + CANARY), CorruptionLabel.DIGEST_MISMATCH),
        (
            lambda k: _redigested(k, raw_messages_stored=True),
            CorruptionLabel.VALIDATION_FAILED,
        ),
        (lambda k: _redigested(k, write_allowed=True), CorruptionLabel.VALIDATION_FAILED),
        (
            lambda k: _redigested(k, schema="sessionstate.record.v9"),
            CorruptionLabel.SCHEMA_MISMATCH,
        ),
        (
            lambda k: canonical_json(record(k, scope("tenant-b")).to_json()),
            CorruptionLabel.SCOPE_MISMATCH,
        ),
        (
            lambda k: json.dumps(record(k).to_json(), indent=1).encode(),
            CorruptionLabel.MALFORMED,
        ),
    ],
    ids=[
        "not-utf8",
        "truncated-json",
        "absurd-nesting",
        "wrong-shape",
        "unknown-field",
        "digest-mismatch",
        "raw-messages-flag",
        "preview-flags",
        "schema-version",
        "other-scope",
        "not-canonical",
    ],
)
def test_corrupt_state_fails_closed_with_a_redacted_error(
    state_store: SessionStateStore,
    lanes: LevelDBLaneStore,
    digest_key: DigestKey,
    caplog: pytest.LogCaptureFixture,
    make_bytes: object,
    label: CorruptionLabel,
) -> None:
    caplog.set_level(logging.DEBUG)
    stored = make_bytes(digest_key)  # type: ignore[operator]
    _corrupt_with(lanes, digest_key, stored)
    report = state_store.read(scope())
    assert report is not None
    assert report.record is None
    assert report.corrupt is True
    assert report.redacted_error == label
    assert report.error_digest == sha256_digest(stored)
    assert report.raw_payload_exposed is False
    for rendered in (repr(report), str(report), report.model_dump_json(), caplog.text):
        assert CANARY not in rendered


def test_a_corrupt_record_is_replaced_only_against_its_error_digest(
    state_store: SessionStateStore, lanes: LevelDBLaneStore, digest_key: DigestKey
) -> None:
    _corrupt_with(lanes, digest_key, b"garbage")
    with pytest.raises(PreconditionFailed):
        state_store.write(record(digest_key), Precondition(if_none_match_any=True))
    state_store.write(record(digest_key), Precondition(if_match=sha256_digest(b"garbage")))
    report = state_store.read(scope())
    assert report is not None and not report.corrupt


def test_concurrent_compare_and_set_loses_no_update(
    state_store: SessionStateStore, digest_key: DigestKey
) -> None:
    """8 threads append turns by compare-and-set; every success is based on what it read."""
    run_compare_and_set([state_store] * 8, digest_key, rounds=12)


def test_synced_write_survives_close_and_reopen(tmp_path: Path, digest_key: DigestKey) -> None:
    lanes = LevelDBLaneStore(tmp_path / "db")
    built = record(digest_key)
    SessionStateStore(lanes).write(built)
    lanes.close()
    reopened = LevelDBLaneStore(tmp_path / "db")
    report = SessionStateStore(reopened).read(scope())
    reopened.close()
    assert report is not None and report.record == built


WRITER = """
import sys
from pathlib import Path
from store.digests import DigestKey
from store.backends.leveldb import LevelDBLaneStore
from store.session_state import SessionStateStore
from tests.support.factories import record
store = SessionStateStore(LevelDBLaneStore(Path(sys.argv[1])))
store.write(record(DigestKey(b"k" * 32)))
print("acknowledged", flush=True)
sys.stdin.read()  # hold the database open until killed
"""


def test_acknowledged_write_survives_sigkill(tmp_path: Path, digest_key: DigestKey) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "acknowledged"
    child.kill()
    child.wait()
    lanes = LevelDBLaneStore(tmp_path / "db")
    report = SessionStateStore(lanes).read(scope())
    lanes.close()
    assert report is not None and report.record == record(digest_key)


def test_the_database_admits_one_process(tmp_path: Path) -> None:
    lanes = LevelDBLaneStore(tmp_path / "db")
    try:
        with pytest.raises(StoreBusy, match="LOCK is held"):
            LevelDBLaneStore(tmp_path / "db")
    finally:
        lanes.close()
