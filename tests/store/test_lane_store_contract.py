"""The lane-store contract (store/backends/contract.py), held over both backends.

Every test with a `lanes` argument runs twice: on the embedded LevelDB and on a
real PostgreSQL started by the tests (tests/support/postgres.py), each in a fresh
database. Tests at the end are PostgreSQL's alone: bytea order is LevelDB's
order, and a database stopped and started again under a live store object.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import plyvel
import pytest

from store.backends.contract import Backend, ExpectationFailed, Lanes, Mode, StoreOffline
from store.backends.leveldb import LevelDBLaneStore
from store.backends.postgres import PostgresLaneStore
from store.backends.postgres_schema import upgrade
from store.backends.registry import BACKENDS, backend
from store.canonical import canonical_json, sha256_digest
from store.chain.evidence import EvidenceChain
from store.chain.keys import entry_key
from store.digests import DigestKey
from store.embedded.integrity import StoreBusy
from store.key_codec import LaneKey, TenantResourceLane, scope_prefix
from store.record.blockers import CorruptionLabel
from store.session_state import Precondition, PreconditionFailed, SessionStateStore, state_key
from store.session_versions import SessionVersions
from store.version_lane import LANE as VERSIONS_LANE
from store.version_lane import VERSIONS_KEPT_DEFAULT, version_key
from tests.support.factories import record, scope
from tests.support.postgres import PostgresServer

APPROVALS = TenantResourceLane.APPROVAL_PACKET
CANARY = "CONTRACT-CANARY-31c9"


@pytest.fixture
def lanes(lanes_on_both: Lanes) -> Lanes:
    return lanes_on_both


def key(tenant: str = "tenant-a", workspace: str = "ws-1", name: bytes = b"k") -> LaneKey:
    return LaneKey(APPROVALS, tenant, workspace, name=name)


# -- single keys ---------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [b"", b"\x00", b"\xff\x00\xfe plain", bytes(range(256)) * 1024],
    ids=["empty", "nul", "binary", "256KiB"],
)
def test_a_value_reads_back_exactly_as_written(lanes: Lanes, value: bytes) -> None:
    lanes.put(key(), value)
    assert lanes.get(key()) == value


def test_a_missing_key_reads_as_none(lanes: Lanes) -> None:
    assert lanes.get(key()) is None


def test_get_many_reads_keys_of_any_tenant_in_their_order(lanes: Lanes) -> None:
    wanted = [key(name=b"b"), key("tenant-b", name=b"a"), key(name=b"none"), key(name=b"a")]
    lanes.put(wanted[0], b"B")
    lanes.put(wanted[1], b"other tenant's")
    lanes.put(wanted[3], b"")
    assert lanes.get_many(wanted) == [b"B", b"other tenant's", None, b""]
    assert lanes.get_many([wanted[0], wanted[0]]) == [b"B", b"B"]
    assert lanes.get_many([]) == []


def test_a_put_replaces_and_a_delete_removes(lanes: Lanes) -> None:
    lanes.put(key(), b"first")
    lanes.put(key(), b"second")
    assert lanes.get(key()) == b"second"
    lanes.delete(key())
    assert lanes.get(key()) is None
    lanes.delete(key())  # deleting what is not there is no error
    assert lanes.get(key()) is None


def test_keys_differ_by_every_component(lanes: Lanes) -> None:
    keys = [
        key(),
        key(tenant="tenant-b"),
        key(workspace="ws-2"),
        LaneKey(APPROVALS, "tenant-a", "ws-1", "session", b"k"),
        key(name=b"k2"),
        LaneKey(TenantResourceLane.TRACE_META, "tenant-a", "ws-1", name=b"k"),
        LaneKey(APPROVALS, name=b"k"),  # names no tenant
    ]
    for index, each in enumerate(keys):
        lanes.put(each, str(index).encode())
    assert [lanes.get(each) for each in keys] == [str(i).encode() for i in range(len(keys))]


# -- batches -----------------------------------------------------------------------


def test_a_batch_commits_its_puts_and_deletes_together(lanes: Lanes) -> None:
    lanes.put(key(name=b"c"), b"old")
    with lanes.batch() as batch:
        batch.put(key(name=b"a"), b"1")
        batch.put(key(tenant="tenant-b", name=b"b"), b"2")
        batch.delete(key(name=b"c"))
    assert lanes.get(key(name=b"a")) == b"1"
    assert lanes.get(key(tenant="tenant-b", name=b"b")) == b"2"
    assert lanes.get(key(name=b"c")) is None


def test_an_exception_inside_a_batch_writes_nothing(lanes: Lanes) -> None:
    lanes.put(key(name=b"c"), b"kept")
    with pytest.raises(RuntimeError, match="interrupted"), lanes.batch() as batch:
        batch.put(key(name=b"a"), b"1")
        batch.put(key(tenant="tenant-b", name=b"b"), b"2")
        batch.delete(key(name=b"c"))
        raise RuntimeError("interrupted")
    assert lanes.get(key(name=b"a")) is None
    assert lanes.get(key(tenant="tenant-b", name=b"b")) is None
    assert lanes.get(key(name=b"c")) == b"kept"
    lanes.put(key(name=b"a"), b"after")  # the store still writes
    assert lanes.get(key(name=b"a")) == b"after"


def test_the_last_write_of_a_key_in_a_batch_wins(lanes: Lanes) -> None:
    with lanes.batch() as batch:
        batch.put(key(name=b"a"), b"1")
        batch.delete(key(name=b"a"))
        batch.put(key(name=b"b"), b"1")
        batch.delete(key(name=b"b"))
        batch.put(key(name=b"b"), b"2")
    assert lanes.get(key(name=b"a")) is None
    assert lanes.get(key(name=b"b")) == b"2"


def test_a_batch_commits_when_its_expectations_hold(lanes: Lanes) -> None:
    lanes.put(key(name=b"seen"), b"v1")
    with lanes.batch() as batch:
        batch.expect(key(name=b"seen"), b"v1")
        batch.expect(key(name=b"absent"), None)
        batch.put(key(name=b"seen"), b"v2")
    assert lanes.get(key(name=b"seen")) == b"v2"


@pytest.mark.parametrize(
    ("stored", "expected"),
    [(b"v1", b"v0"), (b"v1", None), (None, b"v1")],
    ids=["other-bytes", "present-not-absent", "absent-not-present"],
)
def test_a_batch_whose_expectation_fails_writes_nothing(
    lanes: Lanes, stored: bytes | None, expected: bytes | None
) -> None:
    if stored is not None:
        lanes.put(key(name=b"seen"), stored)
    with pytest.raises(ExpectationFailed), lanes.batch() as batch:
        batch.expect(key(name=b"seen"), expected)
        batch.put(key(name=b"seen"), b"v2")
        batch.put(key(name=b"other"), b"x")
    assert lanes.get(key(name=b"seen")) == stored
    assert lanes.get(key(name=b"other")) is None


# -- scans and counts --------------------------------------------------------------

TENANTS = ["a", "b", "aa", "tenant-b", "Z", "-", "0" * 128]
NAMES = [b"", b"\x00", b"\x00\x00", b"\x01", b"\x7f", b"\x80", b"\xfe", b"\xff", b"\xff\x00", b"k"]


def _sample_keys() -> list[LaneKey]:
    rng = random.Random(13)
    keys = {
        LaneKey(lane, tenant, workspace, "", name)
        for lane in (APPROVALS, TenantResourceLane.TRACE_INDEX)
        for tenant in TENANTS
        for workspace in ("", "w", "w2")
        for name in rng.sample(NAMES, 4)
    }
    keys |= {LaneKey(APPROVALS, name=name) for name in NAMES}  # keys that name no tenant
    shuffled = sorted(keys, key=lambda each: each.encode())
    rng.shuffle(shuffled)
    return shuffled


def _expected(keys: list[LaneKey], lane: TenantResourceLane, *scope_: str) -> list[LaneKey]:
    prefix = scope_prefix(lane, *scope_)
    return sorted((k for k in keys if k.encode().startswith(prefix)), key=lambda k: k.encode())


def test_scans_are_in_key_order_under_a_prefix_and_reversed(lanes: Lanes) -> None:
    keys = _sample_keys()
    with lanes.batch() as batch:
        for each in keys:
            batch.put(each, each.encode()[::-1])
    scopes: list[tuple[str, ...]] = [(), ("",), ("a",), ("aa",), ("tenant-b", "w"), ("Z", "")]
    scopes += [("-", "w2"), ("0" * 128,)]
    for scope_ in scopes:
        want = _expected(keys, APPROVALS, *scope_)
        got = list(lanes.scan(APPROVALS, *scope_))
        assert [k for k, _ in got] == want, scope_
        assert all(value == k.encode()[::-1] for k, value in got)
        backwards = [k for k, _ in lanes.scan(APPROVALS, *scope_, reverse=True)]
        assert backwards == want[::-1], scope_


def test_a_scan_with_no_scope_crosses_tenants_in_key_order(lanes: Lanes) -> None:
    keys = _sample_keys()
    with lanes.batch() as batch:
        for each in keys:
            batch.put(each, b"v")
    seen = [k for k, _ in lanes.scan(TenantResourceLane.TRACE_INDEX)]
    assert seen == _expected(keys, TenantResourceLane.TRACE_INDEX)
    assert {k.tenant for k in seen} == set(TENANTS)


def test_long_scans_read_every_key_once_in_order(lanes: Lanes) -> None:
    keys = [key(name=n.to_bytes(2, "big")) for n in range(1500)]
    with lanes.batch() as batch:
        for each in keys:
            batch.put(each, b"v")
    lanes.put(key(tenant="tenant-b"), b"other tenant")
    assert [k for k, _ in lanes.scan(APPROVALS, "tenant-a")] == keys
    assert [k for k, _ in lanes.scan(APPROVALS, "tenant-a", reverse=True)] == keys[::-1]
    reverse = lanes.scan(APPROVALS, "tenant-a", "ws-1", reverse=True)
    assert next(reverse)[0] == keys[-1]  # a caller may stop after the first key
    reverse.close()


def test_a_scan_seeks_to_its_start_and_stops_before_its_stop(lanes: Lanes) -> None:
    keys = _sample_keys()
    with lanes.batch() as batch:
        for each in keys:
            batch.put(each, b"v")
    ordered = sorted(keys, key=LaneKey.encode)
    scopes: list[tuple[str, ...]] = [(), ("a",), ("tenant-b", "w"), ("Z", "")]
    bounds = [ordered[0], ordered[len(ordered) // 3], ordered[len(ordered) // 2], ordered[-1]]
    bounds += [key(tenant="zz-after-all"), LaneKey(APPROVALS)]
    for scope_ in scopes:
        want = _expected(keys, APPROVALS, *scope_)
        for start in [None, *bounds]:
            for stop in [None, *bounds]:
                expected = [
                    k
                    for k in want
                    if (start is None or k.encode() >= start.encode())
                    and (stop is None or k.encode() < stop.encode())
                ]
                got = [k for k, _ in lanes.scan(APPROVALS, *scope_, start=start, stop=stop)]
                assert got == expected, (scope_, start, stop)
                backwards = lanes.scan(APPROVALS, *scope_, reverse=True, start=start, stop=stop)
                assert [k for k, _ in backwards] == expected[::-1], (scope_, start, stop)


def test_a_scan_whose_range_holds_only_its_start_finds_it_in_either_direction(
    lanes: Lanes,
) -> None:
    keys = [key(name=bytes([n])) for n in range(1, 5)]
    with lanes.batch() as batch:
        for each in keys:
            batch.put(each, b"v")
    for index, start in enumerate(keys):
        stop = keys[index + 1] if index + 1 < len(keys) else None
        for reverse in (False, True):
            got = lanes.scan(APPROVALS, "tenant-a", reverse=reverse, start=start, stop=stop)
            assert [k for k, _ in got] == [start], (index, reverse)


def test_a_long_scan_from_a_start_pages_on_from_it(lanes: Lanes) -> None:
    keys = [key(name=n.to_bytes(2, "big")) for n in range(1500)]
    with lanes.batch() as batch:
        for each in keys:
            batch.put(each, b"v")
    assert [k for k, _ in lanes.scan(APPROVALS, "tenant-a", start=keys[700])] == keys[700:]
    assert [k for k, _ in lanes.scan(APPROVALS, "tenant-a", stop=keys[1300], reverse=True)] == (
        keys[:1300][::-1]
    )


def test_an_expunge_keeps_every_key_and_leaves_the_deleted_ones_deleted(lanes: Lanes) -> None:
    lane = TenantResourceLane.SESSION_STATE
    erased, kept = (LaneKey(lane, "tenant-a", "ws-1", session) for session in ("s-1", "s-2"))
    for written in (erased, kept):
        lanes.put(written, CANARY.encode())
    with lanes.batch() as batch:
        batch.delete(erased)
    assert lanes.expunge(lane, "tenant-a", "ws-1", "s-1") is True
    assert lanes.get(erased) is None
    assert lanes.get(kept) == CANARY.encode()
    assert [found for found, _ in lanes.scan(lane, "tenant-a")] == [kept]


def test_leveldb_s_expunge_leaves_no_erased_byte_in_its_files(tmp_path: Path) -> None:
    """Whatever level its tables are at: written once, rewritten under other keys' writes."""
    store = LevelDBLaneStore(tmp_path / "db")
    lane = TenantResourceLane.SESSION_STATE
    erased = LaneKey(lane, "tenant-a", "ws-1", "s-1")
    for round_ in range(3):
        store.put(erased, f"{CANARY}-{round_}".encode())
        for n in range(2000):
            store.put(LaneKey(lane, "tenant-a", "ws-1", f"o-{n}"), b"x" * 40, sync=False)
        assert store.expunge(lane, "tenant-a", "ws-2")  # pushes tables down, erases nothing
    with store.batch() as batch:
        batch.delete(erased)
    assert store.expunge(lane, "tenant-a", "ws-1", "s-1")
    files = [path for path in (tmp_path / "db").iterdir() if path.is_file()]
    assert not [path for path in files if CANARY.encode() in path.read_bytes()]
    assert store.get(LaneKey(lane, "tenant-a", "ws-1", "o-7")) == b"x" * 40
    store.close()


def test_leveldb_s_expunge_says_so_when_an_older_read_keeps_a_snapshot(tmp_path: Path) -> None:
    store = LevelDBLaneStore(tmp_path / "db")
    lane = TenantResourceLane.SESSION_STATE
    erased = LaneKey(lane, "tenant-a", "ws-1", "s-1")
    store.put(erased, CANARY.encode())
    reading = store.scan(lane)
    next(reading)  # a read under way, begun before the erasure: its snapshot holds the value
    store.delete(erased)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("store.backends.leveldb.READER_WAIT_SECONDS", 0)
        assert store.expunge(lane, "tenant-a", "ws-1", "s-1") is False
    reading.close()
    assert store.expunge(lane, "tenant-a", "ws-1", "s-1") is True
    files = [path for path in (tmp_path / "db").iterdir() if path.is_file()]
    assert not [path for path in files if CANARY.encode() in path.read_bytes()]
    store.close()


def test_count_counts_a_lane_across_tenants(lanes: Lanes) -> None:
    keys = _sample_keys()
    with lanes.batch() as batch:
        for each in keys:
            batch.put(each, b"v")
    assert lanes.count(APPROVALS) == len(_expected(keys, APPROVALS))
    assert lanes.count(TenantResourceLane.TRACE_INDEX) == len(
        _expected(keys, TenantResourceLane.TRACE_INDEX)
    )
    assert lanes.count(TenantResourceLane.SESSION_STATE) == 0


# -- lifecycle ---------------------------------------------------------------------


def test_a_healthy_store_is_writable_and_reopens_keeping_its_data(lanes: Lanes) -> None:
    lanes.put(key(), b"kept")
    assert lanes.writable and not lanes.closed
    assert lanes.room_to_reopen()
    lanes.reopen()
    assert lanes.writable
    assert lanes.get(key()) == b"kept"


def test_a_closed_store_is_offline(lanes: Lanes) -> None:
    lanes.put(key(), b"v")
    lanes.close()
    assert lanes.closed and not lanes.writable
    with pytest.raises(StoreOffline):
        lanes.get(key())
    with pytest.raises(StoreOffline):
        lanes.put(key(), b"w")
    with pytest.raises(StoreOffline):
        list(lanes.scan(APPROVALS))


# -- as a backend: registered by name, opened in a mode ----------------------------


@pytest.fixture(params=[LevelDBLaneStore.NAME, PostgresLaneStore.NAME])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[type[Backend], str]:
    """A backend by its registered name, and the location of a store of it holding `key()`."""
    found = backend(request.param)
    place = (
        str(tmp_path / "leveldb")
        if found is LevelDBLaneStore
        else request.getfixturevalue("postgres_conninfo")
    )
    written = found.open(place, Mode.SERVE)
    try:
        written.put(key(), b"written")
    finally:
        written.close()
    return found, place


def test_every_backend_is_registered_under_its_name() -> None:
    assert {"leveldb": LevelDBLaneStore, "postgresql": PostgresLaneStore} == BACKENDS


@pytest.mark.parametrize("mode", list(Mode))
def test_a_backend_opens_its_store_in_every_mode_declaring_what_it_can(
    location: tuple[type[Backend], str], mode: Mode
) -> None:
    found, place = location
    assert found.present(place)
    opened = found.open(place, mode)
    try:
        assert opened.get(key()) == b"written"
        declared, has = found.CAPABILITIES, opened.capabilities
        assert (has.shared, has.repair, has.recovery) == (
            declared.shared,
            declared.repair,
            declared.recovery,
        )
        assert (has.log_tail, has.probe) == (declared.log_tail, declared.probe)
    finally:
        opened.close()


def test_a_store_opened_read_only_refuses_writes_and_is_left_as_it_was(
    location: tuple[type[Backend], str],
) -> None:
    found, place = location
    before = _files(Path(place)) if found is LevelDBLaneStore else None
    viewed = found.open(place, Mode.READ_ONLY)
    try:
        for write in (
            lambda: viewed.put(key(), b"changed"),
            lambda: viewed.delete(key()),
            lambda: _batch_put(viewed, key(name=b"other"), b"new"),
        ):
            with pytest.raises(StoreOffline):
                write()
        assert viewed.get(key()) == b"written"
    finally:
        viewed.close()
    if before is not None:
        assert _files(Path(place)) == before  # not even LevelDB's own log or manifest
    again = found.open(place, Mode.SERVE)
    try:
        assert again.get(key()) == b"written" and again.get(key(name=b"other")) is None
    finally:
        again.close()


def test_a_leveldb_opened_read_only_is_a_copy_deleted_at_close(tmp_path: Path) -> None:
    LevelDBLaneStore(tmp_path / "leveldb").close()
    viewed = LevelDBLaneStore.open(str(tmp_path / "leveldb"), Mode.READ_ONLY)
    copy = viewed.path
    assert copy != tmp_path / "leveldb" and copy.is_dir()
    viewed.close()
    assert not copy.exists()


def test_a_leveldb_another_process_holds_is_not_copied(tmp_path: Path) -> None:
    """Held by another process: POSIX record locks do not conflict within one process
    (and closing a descriptor drops them all), so the holder must be another one."""
    LevelDBLaneStore(tmp_path / "leveldb").close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from store.backends.leveldb import LevelDBLaneStore; "
            "held = LevelDBLaneStore(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()",
            str(tmp_path / "leveldb"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(StoreBusy):
            LevelDBLaneStore.open(str(tmp_path / "leveldb"), Mode.READ_ONLY)
    finally:
        holder.communicate("", timeout=30)


def test_an_embedded_store_not_made_yet_is_not_present(tmp_path: Path) -> None:
    assert not LevelDBLaneStore.present(str(tmp_path / "leveldb"))


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def _batch_put(lanes: Lanes, at: LaneKey, value: bytes) -> None:
    with lanes.batch() as batch:
        batch.put(at, value)


# -- the session store and the evidence chain over the contract --------------------


def test_compare_and_set_through_the_session_store_loses_no_update(
    lanes: Lanes, digest_key: DigestKey
) -> None:
    states = SessionStateStore(lanes)
    successes = run_compare_and_set([states] * 8, digest_key, rounds=6)
    # Every write took the next number: the versions kept are the newest, one line, each
    # the write that was built on the one before it.
    kept = SessionVersions(lanes).page(scope(), limit=100)
    assert [v.version for v in kept] == list(range(49, 49 - VERSIONS_KEPT_DEFAULT, -1))
    for newer, older in itertools.pairwise(kept):
        assert (older.state_digest, newer.state_digest) in successes


def run_compare_and_set(
    stores: list[SessionStateStore], digest_key: DigestKey, *, rounds: int
) -> list[tuple[str, str]]:
    """One writer thread per store appends turns by If-Match; every success built on its read."""
    stores[0].write(record(digest_key, turns=[]))
    successes: list[tuple[str, str]] = []  # (version read, version written)
    lock = threading.Lock()

    def writer(n: int, states: SessionStateStore) -> None:
        for r in range(rounds):
            while True:
                current = states.read(scope())
                assert current is not None and current.record is not None
                turns = [t.model_dump(mode="json") for t in current.record.turns]
                turns.append({"turn_id": f"w{n}-r{r}", "role": "user", "payload": f"{n}/{r}"})
                updated = record(digest_key, turns=turns)
                try:
                    states.write(updated, Precondition(if_match=current.record.state_digest))
                except PreconditionFailed:
                    continue
                with lock:
                    successes.append((current.record.state_digest, updated.state_digest))
                break

    threads = [threading.Thread(target=writer, args=pair) for pair in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    final = stores[0].read(scope())
    assert final is not None and final.record is not None
    assert len(final.record.turns) == len(stores) * rounds
    based_on = [read for read, _ in successes]
    assert len(set(based_on)) == len(successes) == len(stores) * rounds
    written = {wrote for _, wrote in successes}
    assert set(based_on) - written == {record(digest_key, turns=[]).state_digest}
    assert written - set(based_on) == {final.record.state_digest}
    return successes


def test_a_session_keeps_its_newest_versions_and_reads_each_back(
    lanes: Lanes, digest_key: DigestKey
) -> None:
    states, versions = SessionStateStore(lanes), SessionVersions(lanes)
    written = [record(digest_key, state_id=f"state-{n}") for n in range(1, 6)]
    for built in written:
        states.write(built, kept=3)
    assert [v.version for v in versions.page(scope(), limit=10)] == [5, 4, 3]
    assert [v.version for v in versions.page(scope(), limit=10, below=5)] == [4, 3]
    assert [v.state_digest for v in versions.page(scope(), limit=1)] == [written[4].state_digest]
    old = versions.read(scope(), 3)
    assert old is not None and old.record == written[2]
    assert versions.read(scope(), 2) is None
    assert lanes.count(VERSIONS_LANE) == 3
    found = versions.current(scope())
    assert found is not None and found[1] == 5 and found[0].record == written[4]


def test_a_record_from_before_versions_is_version_1_and_kept_so_at_the_next_write(
    lanes: Lanes, digest_key: DigestKey
) -> None:
    states, versions = SessionStateStore(lanes), SessionVersions(lanes)
    legacy = record(digest_key, state_id="state-legacy")
    lanes.put(state_key(scope()), canonical_json(legacy.to_json()))  # as an older release wrote
    found = versions.current(scope())
    assert found is not None and found[1] == 1
    (listed,) = versions.page(scope(), limit=10)
    assert (listed.version, listed.state_digest, listed.decision_id) == (
        1,
        legacy.state_digest,
        None,
    )
    first = versions.read(scope(), 1)
    assert first is not None and first.record == legacy
    states.write(record(digest_key, state_id="state-next"))
    assert [v.version for v in versions.page(scope(), limit=10)] == [2, 1]
    kept = versions.read(scope(), 1)
    assert kept is not None and kept.record == legacy


def test_a_version_that_does_not_read_is_listed_by_its_bytes_and_read_as_corrupt(
    lanes: Lanes, digest_key: DigestKey
) -> None:
    SessionStateStore(lanes).write(record(digest_key))
    lanes.put(version_key(scope(), 1), b"\xff not a version")
    versions = SessionVersions(lanes)
    (listed,) = versions.page(scope(), limit=10)
    assert listed.state_digest == sha256_digest(b"\xff not a version")
    report = versions.read(scope(), 1)
    assert report is not None and report.corrupt and report.record is None
    assert report.redacted_error is CorruptionLabel.MALFORMED


def test_holders_of_a_key_take_turns_and_read_each_others_writes(
    lanes: Lanes, request: pytest.FixtureRequest
) -> None:
    """Read-increment-write with no expectation, from threads on two store objects (one on
    LevelDB, which one process owns): under `exclusive` no increment is lost."""
    stores = [lanes]
    if isinstance(lanes, PostgresLaneStore):
        stores.append(PostgresLaneStore(request.getfixturevalue("postgres_conninfo"), timeout=5))
    held, counter = key(name=b"hold"), key(name=b"counter")
    lanes.put(held, b"")
    lanes.put(counter, b"0")
    inside: list[int] = []

    def increment(store: Lanes, rounds: int) -> None:
        for _ in range(rounds):
            with store.exclusive(held):
                inside.append(1)
                assert len(inside) == 1  # nobody else holds it now
                value = int(store.get(counter) or b"0")
                with store.batch() as batch:
                    batch.put(counter, str(value + 1).encode())
                inside.pop()

    threads = [
        threading.Thread(target=increment, args=(stores[n % len(stores)], 10)) for n in range(6)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert lanes.get(counter) == b"60"
    finally:
        for other in stores[1:]:
            other.close()


def test_a_key_not_stored_yet_holds_nothing_and_does_not_fail(lanes: Lanes) -> None:
    with lanes.exclusive(key(name=b"absent")):
        lanes.put(key(name=b"k"), b"v")
    assert lanes.get(key(name=b"k")) == b"v"


def _tampered(digest_key: DigestKey) -> bytes:
    return canonical_json(record(digest_key).to_json() | {"state_id": "state-" + CANARY})


@pytest.mark.parametrize(
    ("make_bytes", "label"),
    [
        (lambda k: CANARY.encode() + b"\xff\xfe not json", CorruptionLabel.MALFORMED),
        (lambda k: ('{"note": "' + CANARY + '"').encode(), CorruptionLabel.MALFORMED),
        (lambda k: json.dumps({"schema": CANARY}).encode(), CorruptionLabel.SCHEMA_MISMATCH),
        (_tampered, CorruptionLabel.DIGEST_MISMATCH),
        (
            lambda k: canonical_json(record(k, scope("tenant-b")).to_json()),
            CorruptionLabel.SCOPE_MISMATCH,
        ),
    ],
    ids=["not-utf8", "truncated-json", "wrong-shape", "digest-mismatch", "other-scope"],
)
def test_corrupt_state_reads_fail_closed_alike(
    lanes: Lanes, digest_key: DigestKey, make_bytes: object, label: CorruptionLabel
) -> None:
    stored: bytes = make_bytes(digest_key)  # type: ignore[operator]
    lanes.put(state_key(scope()), stored)
    report = SessionStateStore(lanes).read(scope())
    assert report is not None
    assert report.record is None and report.corrupt is True
    assert report.redacted_error == label
    assert report.error_digest == sha256_digest(stored)
    assert report.key_digest == state_key(scope()).digest()
    assert CANARY not in report.model_dump_json()


def test_a_corrupt_record_is_replaced_only_against_its_error_digest(
    lanes: Lanes, digest_key: DigestKey
) -> None:
    states = SessionStateStore(lanes)
    lanes.put(state_key(scope()), b"garbage")
    with pytest.raises(PreconditionFailed):
        states.write(record(digest_key), Precondition(if_none_match_any=True))
    states.write(record(digest_key), Precondition(if_match=sha256_digest(b"garbage")))
    report = states.read(scope())
    assert report is not None and not report.corrupt


def _body(n: int) -> dict[str, object]:
    return {"recorded_at": "2026-01-02T03:04:05.000000Z", "decision": {"n": n}}


def test_the_evidence_chain_appends_and_verifies(lanes: Lanes) -> None:
    chain = EvidenceChain(lanes)
    assert chain.head().seq == 0
    first = chain.append([_body(1), _body(2)])
    second = chain.append([_body(3)])
    assert [entry["seq"] for entry in first + second] == [1, 2, 3]
    assert second[0]["prev_hash"] == first[1]["hash"]
    assert chain.head().seq == 3 and chain.head().hash == second[0]["hash"]
    verified = chain.verify()
    assert verified.ok and verified.entries == 3 and verified.head_hash == second[0]["hash"]
    assert chain.get(2) == first[1]
    assert [entry["seq"] for entry in chain.scan(reverse=True)] == [3, 2, 1]
    assert [seq for seq, _ in chain.stored_entries(until_seq=2)] == [1, 2]


def test_the_evidence_chain_shows_an_entry_changed_in_the_store(lanes: Lanes) -> None:
    chain = EvidenceChain(lanes)
    entries = chain.append([_body(1), _body(2), _body(3)])
    changed = dict(entries[1], decision={"n": 20})
    lanes.put(entry_key(2), canonical_json(changed))
    verified = chain.verify()
    assert not verified.ok
    assert verified.first_invalid_seq == 2 and verified.problem == "hash_mismatch"


# -- PostgreSQL's own --------------------------------------------------------------


def test_bytea_orders_keys_as_leveldb_does(postgres: PostgresServer, tmp_path: Path) -> None:
    """PostgreSQL's bytea order is LevelDB's bytewise order (memcmp, then shorter first)."""
    rng = random.Random(7)
    alphabet = [0x00, 0x01, 0x41, 0x7F, 0x80, 0xC3, 0xFE, 0xFF]
    samples = {bytes(rng.choices(alphabet, k=rng.randint(0, 6))) for _ in range(3000)}
    with postgres.connect() as conn:
        rows = conn.execute(
            "SELECT k FROM unnest(%s::bytea[]) AS k ORDER BY k", (list(samples),)
        ).fetchall()
    by_postgres = [bytes(row[0]) for row in rows]
    db = plyvel.DB(str(tmp_path / "order"), create_if_missing=True)
    try:
        with db.write_batch() as batch:
            for sample in samples:
                batch.put(b"." + sample, b"")  # LevelDB keys cannot be empty
        by_leveldb = [raw[1:] for raw, _ in db.iterator()]
    finally:
        db.close()
    assert by_postgres == by_leveldb == sorted(samples)


def test_both_backends_scan_the_same_keys_in_the_same_order(
    postgres_conninfo: str, tmp_path: Path
) -> None:
    keys = _sample_keys()
    level = LevelDBLaneStore(tmp_path / "leveldb")
    pg = PostgresLaneStore(postgres_conninfo, timeout=2.0)
    try:
        for store in (level, pg):
            with store.batch() as batch:
                for each in keys:
                    batch.put(each, b"v")
        for lane in (APPROVALS, TenantResourceLane.TRACE_INDEX):
            for reverse in (False, True):
                assert list(level.scan(lane, reverse=reverse)) == list(
                    pg.scan(lane, reverse=reverse)
                )
    finally:
        level.close()
        pg.close()


def test_a_stopped_database_is_offline_and_serves_again_when_started(
    postgres_own: PostgresServer, digest_key: DigestKey
) -> None:
    conninfo = postgres_own.create_database()
    upgrade(conninfo)
    store = PostgresLaneStore(conninfo, timeout=0.5)
    states = SessionStateStore(store)
    chain = EvidenceChain(store)
    try:
        states.write(record(digest_key))
        chain.append([_body(1)])
        postgres_own.stop()

        for operation in (
            lambda: store.get(key()),
            lambda: store.put(key(), b"while down"),
            lambda: list(store.scan(APPROVALS)),
            lambda: store.count(APPROVALS),
            lambda: states.read(scope()),
            lambda: chain.append([_body(2)]),
            lambda: store.reopen(),
        ):
            with pytest.raises(StoreOffline):
                operation()
        with pytest.raises(StoreOffline), store.batch() as batch:
            batch.put(key(name=b"a"), b"1")
            batch.put(key(name=b"b"), b"2")

        postgres_own.start()
        # The same store object, no reopen: nothing of the failed writes, all of the rest.
        assert store.writable
        assert store.get(key()) is None
        assert store.get(key(name=b"a")) is None and store.get(key(name=b"b")) is None
        report = states.read(scope())
        assert report is not None and report.record == record(digest_key)
        verified = chain.verify()
        assert verified.ok and verified.entries == 1
        store.put(key(), b"after")
        assert store.get(key()) == b"after"
        assert chain.append([_body(2)])[0]["seq"] == 2
    finally:
        store.close()
