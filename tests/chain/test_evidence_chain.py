"""`EvidenceChain` on a real LevelDB: appends link, every tampering names its first bad seq."""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from store.backends.contract import LaneBatch
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import Encoded, canonical_digest, canonical_json
from store.chain.checkpoints import CheckpointSigner, RetentionAnchor
from store.chain.entry import ChainCorrupt, seal
from store.chain.evidence import EvidenceChain
from store.chain.head import GENESIS_HASH, NO_TENANT_CHAIN, ChainHead, format_timestamp
from store.chain.keys import ANCHOR_KEY, entry_key
from store.key_codec import LaneKey, TenantResourceLane, lane_prefix

T0 = datetime(2025, 1, 1, tzinfo=UTC)
CANARY = "EVIDENCE-CANARY-91c2"
SIGNER = CheckpointSigner(b"\x05" * 32)
VERIFIER = SIGNER.verifier()


def body(n: int, *, at: datetime | None = None) -> dict[str, Any]:
    """A decision-log-like body recorded n minutes after T0."""
    moment = at if at is not None else T0 + timedelta(minutes=n)
    return {"recorded_at": format_timestamp(moment), "decision": f"d{n}", "allow": n % 2 == 0}


def filled(lanes: LevelDBLaneStore, count: int) -> tuple[EvidenceChain, list[dict[str, Any]]]:
    chain = EvidenceChain(lanes)
    return chain, chain.append([body(n) for n in range(1, count + 1)])


def rewrite(lanes: LevelDBLaneStore, seq: int, entry: dict[str, Any]) -> None:
    lanes.put(entry_key(seq), canonical_json(entry))


def rehashed(entry: dict[str, Any]) -> dict[str, Any]:
    """What an attacker who knows the scheme writes: the hash recomputed to match."""
    content = {name: value for name, value in entry.items() if name != "hash"}
    return content | {"hash": canonical_digest(content)}


def assert_fails(chain: EvidenceChain, seq: int | None, problem: str, **checkpoint: Any) -> None:
    outcome = chain.verify(**({"verifier": VERIFIER} | checkpoint))
    assert (outcome.ok, outcome.first_invalid_seq, outcome.problem) == (False, seq, problem)


@contextmanager
def failing_after(lanes: LevelDBLaneStore, writes: int) -> Iterator[None]:
    """Make the lane store's next batch fail after `writes` puts or deletes."""
    real = lanes.batch

    @contextmanager
    def batch(*, sync: bool = True) -> Iterator[LaneBatch]:
        with real(sync=sync) as inner:
            yield _Failing(inner, writes)

    lanes.batch = batch  # type: ignore[method-assign]
    try:
        yield
    finally:
        del lanes.batch


class _Failing:
    def __init__(self, inner: LaneBatch, writes: int) -> None:
        self.inner, self.left = inner, writes

    def _spend(self) -> None:
        if self.left == 0:
            raise OSError("disk went away")
        self.left -= 1

    def put(self, key: LaneKey, value: bytes) -> None:
        self._spend()
        self.inner.put(key, value)

    def delete(self, key: LaneKey) -> None:
        self._spend()
        self.inner.delete(key)

    def expect(self, key: LaneKey, value: bytes | None) -> None:
        self.inner.expect(key, value)


# Appending


def test_a_new_chain_starts_at_genesis(lanes: LevelDBLaneStore) -> None:
    chain = EvidenceChain(lanes)
    assert chain.head() == ChainHead(seq=0, hash=GENESIS_HASH) == chain.anchor()
    assert GENESIS_HASH == "sha256:" + "0" * 64


def test_appending_assigns_contiguous_seqs_and_links_hashes(lanes: LevelDBLaneStore) -> None:
    chain = EvidenceChain(lanes)
    first = chain.append([body(1), body(2)])
    second = chain.append([body(3)])
    entries = first + second
    assert [entry["seq"] for entry in entries] == [1, 2, 3]
    assert [entry["prev_hash"] for entry in entries] == [
        GENESIS_HASH,
        entries[0]["hash"],
        entries[1]["hash"],
    ]
    for entry in entries:
        content = {name: value for name, value in entry.items() if name != "hash"}
        assert entry["hash"] == canonical_digest(content)
    assert entries[2]["decision"] == "d3"
    assert chain.head() == ChainHead(seq=3, hash=entries[2]["hash"])


def test_entries_are_stored_as_canonical_json_in_seq_order(lanes: LevelDBLaneStore) -> None:
    _, entries = filled(lanes, 3)
    stored = list(lanes.scan(TenantResourceLane.TRACE_EVIDENCE))
    assert [key for key, _ in stored] == [
        LaneKey(TenantResourceLane.TRACE_EVIDENCE, NO_TENANT_CHAIN, name=seq.to_bytes(8, "big"))
        for seq in (1, 2, 3)
    ]
    assert [value for _, value in stored] == [canonical_json(entry) for entry in entries]


def test_seal_is_pure_and_continues_from_the_head_it_is_given() -> None:
    head = ChainHead(seq=41, hash=canonical_digest("earlier"))
    sealed, new_head = seal([body(1), body(2)], head)
    again, _ = seal([body(1), body(2)], head)
    assert sealed == again
    assert [item.entry["seq"] for item in sealed] == [42, 43]
    assert sealed[0].entry["prev_hash"] == head.hash
    assert sealed[0].key == entry_key(42) and sealed[0].value == canonical_json(sealed[0].entry)
    assert new_head == ChainHead(seq=43, hash=sealed[1].entry["hash"])


def test_seal_does_not_keep_a_reference_to_the_callers_body() -> None:
    given_body = body(1) | {"tags": ["a"]}
    sealed, _ = seal([given_body], ChainHead(seq=0, hash=GENESIS_HASH))
    given_body["tags"].append("b")
    assert sealed[0].entry["tags"] == ["a"]
    assert "seq" not in given_body


def test_a_body_that_would_not_read_back_as_written_is_refused(lanes: LevelDBLaneStore) -> None:
    """2.0 ** 60 is written `1152921504606846976` and reads back as an int JSON cannot carry."""
    with pytest.raises(ValueError, match="body 0 does not read back"):
        EvidenceChain(lanes).append([body(1) | {"big": 2.0**60}])
    assert lanes.get(entry_key(1)) is None


def test_several_bodies_are_written_all_or_nothing(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 1)
    head = chain.head()
    with pytest.raises(ValueError, match="body 1 is not canonical JSON"):
        chain.append([body(2), body(3) | {"unserialisable": object()}, body(4)])
    assert chain.head() == head
    assert lanes.get(entry_key(2)) is None


def test_a_batch_failing_midway_writes_nothing(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 1)
    head = chain.head()
    with failing_after(lanes, 1), pytest.raises(OSError, match="disk went away"):
        chain.append([body(2), body(3)])
    assert chain.head() == head
    assert lanes.get(entry_key(2)) is None and lanes.get(entry_key(3)) is None
    assert chain.verify().ok


@pytest.mark.parametrize("field", ["seq", "prev_hash", "hash"])
def test_bodies_may_not_set_the_chain_fields(lanes: LevelDBLaneStore, field: str) -> None:
    with pytest.raises(ValueError, match=f"body 0 sets {field}"):
        EvidenceChain(lanes).append([body(1) | {field: 1}])
    assert EvidenceChain(lanes).head().seq == 0


@pytest.mark.parametrize(
    "recorded_at",
    [None, "2025-01-01T00:00:00+00:00", "2025-01-01T00:00:00", "2025-13-01T00:00:00Z", 1735689600],
    ids=["missing", "offset", "naive", "month_13", "epoch"],
)
def test_bodies_need_a_utc_recorded_at(lanes: LevelDBLaneStore, recorded_at: object) -> None:
    bad = {"decision": "d"} if recorded_at is None else {"recorded_at": recorded_at}
    with pytest.raises(ValueError, match="recorded_at"):
        EvidenceChain(lanes).append([body(1), bad])
    assert lanes.get(entry_key(1)) is None


def test_appending_nothing_writes_nothing(lanes: LevelDBLaneStore) -> None:
    assert EvidenceChain(lanes).append([]) == []
    assert list(lanes.scan(TenantResourceLane.TRACE_EVIDENCE)) == []


def test_the_head_survives_reopening_the_database(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 3)
    head = chain.head()
    lanes.close()
    reopened = LevelDBLaneStore(lanes.path)
    try:
        again = EvidenceChain(reopened)
        assert again.head() == head == ChainHead(seq=3, hash=entries[-1]["hash"])
        assert again.append([body(4)])[0]["prev_hash"] == head.hash
        assert again.verify().ok
    finally:
        reopened.close()


def test_concurrent_appends_do_not_fork_the_chain(lanes: LevelDBLaneStore) -> None:
    def append_ten(worker: int) -> None:
        chain = EvidenceChain(lanes)  # a chain per thread: the lock is per database
        for n in range(10):
            chain.append([body(100 * worker + n)])

    threads = [threading.Thread(target=append_ten, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    chain = EvidenceChain(lanes)
    assert chain.head().seq == 40
    assert chain.verify().ok and chain.verify().entries == 40


# Reading


def test_get_returns_what_append_returned(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 3)
    assert [chain.get(seq) for seq in (1, 2, 3)] == entries
    assert chain.get(0) is None and chain.get(4) is None and chain.get(-1) is None


def test_scan_starts_after_a_seq_in_either_direction(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 5)
    assert list(chain.scan()) == entries
    assert list(chain.scan(after_seq=3)) == entries[3:]
    assert list(chain.scan(reverse=True)) == entries[::-1]
    assert list(chain.scan(after_seq=3, reverse=True)) == entries[:2:-1]
    assert list(chain.scan(after_seq=5)) == []


def test_reads_skip_unreadable_entries(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 3)
    lanes.put(entry_key(2), b"\xff" + CANARY.encode())
    assert chain.get(2) is None
    assert list(chain.scan()) == [entries[0], entries[2]]


# Verifying


def test_an_empty_chain_verifies(lanes: LevelDBLaneStore) -> None:
    outcome = EvidenceChain(lanes).verify()
    assert outcome.ok and outcome.entries == 0 and outcome.head_hash == GENESIS_HASH
    assert outcome.first_invalid_seq is None and outcome.problem is None


def test_an_intact_chain_verifies(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 5)
    outcome = chain.verify()
    assert outcome.ok and outcome.entries == 5 and outcome.head_hash == entries[-1]["hash"]
    assert outcome.problem is None and outcome.first_invalid_seq is None


def test_an_edited_field_under_the_old_hash_is_a_hash_mismatch(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 5)
    rewrite(lanes, 3, entries[2] | {"allow": not entries[2]["allow"]})
    assert_fails(chain, 3, "hash_mismatch")
    assert chain.verify().entries == 2 and chain.verify().head_hash == entries[1]["hash"]


def test_an_edit_with_a_recomputed_hash_breaks_the_next_link(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 5)
    rewrite(lanes, 3, rehashed(entries[2] | {"decision": "forged"}))
    assert_fails(chain, 4, "prev_hash_mismatch")


def test_an_edited_last_entry_is_a_hash_mismatch(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 3)
    rewrite(lanes, 3, entries[2] | {"note": "added"})
    assert_fails(chain, 3, "hash_mismatch")


def test_a_deleted_middle_entry_is_a_seq_gap(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 5)
    lanes.delete(entry_key(3))
    assert_fails(chain, 3, "seq_gap")


def test_a_deleted_first_entry_is_a_seq_gap(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 5)
    lanes.delete(entry_key(1))
    assert_fails(chain, 1, "seq_gap")


def test_an_entry_inserted_by_shifting_the_rest_is_a_seq_mismatch(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 5)
    for entry in reversed(entries[2:]):
        rewrite(lanes, entry["seq"] + 1, entry)
    # The forged entry links perfectly to entry 2; the one it displaced no longer fits.
    forged = rehashed(body(99) | {"seq": 3, "prev_hash": entries[1]["hash"]})
    rewrite(lanes, 3, forged)
    assert_fails(chain, 4, "seq_mismatch")


def test_a_forged_entry_under_an_existing_seq_breaks_the_next_link(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 5)
    rewrite(lanes, 3, rehashed(body(99) | {"seq": 3, "prev_hash": entries[1]["hash"]}))
    assert_fails(chain, 4, "prev_hash_mismatch")


def test_reordered_entries_are_a_seq_mismatch(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 5)
    rewrite(lanes, 2, entries[2])
    rewrite(lanes, 3, entries[1])
    assert_fails(chain, 2, "seq_mismatch")


@pytest.mark.parametrize(
    "stored",
    [
        b"\xff\xfe" + CANARY.encode(),
        CANARY.encode(),
        b'["' + CANARY.encode() + b'"]',
        b'{"seq":2,"seq":3,"canary":"' + CANARY.encode() + b'"}',
        b'{"seq":NaN,"canary":"' + CANARY.encode() + b'"}',
        b"[" * 100_000,
    ],
    ids=["not_utf8", "not_json", "not_an_object", "duplicate_key", "nan", "deep"],
)
def test_unreadable_bytes_are_named_and_never_repeated(
    lanes: LevelDBLaneStore, caplog: pytest.LogCaptureFixture, stored: bytes
) -> None:
    caplog.set_level(logging.DEBUG)
    chain, _ = filled(lanes, 3)
    lanes.put(entry_key(2), stored)
    outcome = chain.verify()
    assert (outcome.first_invalid_seq, outcome.problem) == (2, "entry_unreadable")
    assert CANARY not in outcome.model_dump_json() + repr(outcome) + caplog.text


def test_content_that_cannot_be_canonical_is_a_hash_mismatch(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 3)
    rewrite_bytes = canonical_json(entries[1])[:-1] + b',"n":1e999}'
    lanes.put(entry_key(2), rewrite_bytes)
    assert_fails(chain, 2, "hash_mismatch")


@pytest.mark.parametrize(
    "respell",
    [
        lambda stored: stored.replace(b",", b", "),  # spaces between members
        lambda stored: json.dumps(json.loads(stored), sort_keys=False).encode(),  # json's own
        lambda stored: stored.replace(b'"seq"', b'"\\u0073eq"'),  # an escaped name
        lambda stored: stored + b" ",  # a trailing space
    ],
    ids=["spaces", "json_dumps", "escaped_name", "trailing_space"],
)
def test_an_entry_respelled_but_not_changed_is_not_canonical(
    lanes: LevelDBLaneStore, respell: Any
) -> None:
    """The same entry in other bytes hashes to its `hash` and links, but it is not what the
    service wrote, nor the Merkle leaf a proof of it shows."""
    chain, entries = filled(lanes, 3)
    stored = canonical_json(entries[1])
    assert respell(stored) != stored
    lanes.put(entry_key(2), respell(stored))
    assert_fails(chain, 2, "entry_not_canonical")


def test_a_key_the_chain_never_writes_is_unreadable(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 3)
    lanes.put(LaneKey(TenantResourceLane.TRACE_EVIDENCE, NO_TENANT_CHAIN, name=b"\x00" * 9), b"{}")
    assert_fails(chain, 4, "entry_unreadable")


def test_a_key_that_does_not_decode_is_unreadable(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 3)
    # Only raw database access can write a key the key codec never produces.
    raw_key = entry_key(3).encode() + CANARY.encode()
    lanes._db.put(raw_key, b"{}")
    outcome = chain.verify()
    assert (outcome.first_invalid_seq, outcome.problem) == (4, "entry_unreadable")
    assert CANARY not in repr(outcome)
    with pytest.raises(ChainCorrupt) as raised:
        chain.head()
    assert CANARY not in str(raised.value)


def test_other_lanes_and_scopes_are_not_part_of_the_chain(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 2)
    lanes.put(LaneKey(TenantResourceLane.TRACE_EVIDENCE, "tenant", name=entry_key(3).name), b"x")
    lanes.put(LaneKey(TenantResourceLane.TRACE_INDEX, name=entry_key(3).name), b"x")
    assert chain.verify().ok and chain.head().seq == 2
    assert lane_prefix(TenantResourceLane.TRACE_EVIDENCE) != lane_prefix(
        TenantResourceLane.TRACE_INDEX
    )


def test_an_unreadable_newest_entry_stops_appends(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 3)
    lanes.put(entry_key(3), CANARY.encode())
    with pytest.raises(ChainCorrupt) as raised:
        chain.append([body(4)])
    assert CANARY not in str(raised.value)
    assert lanes.get(entry_key(4)) is None


# Checkpoints


def test_a_truncated_tail_is_found_only_by_an_earlier_checkpoint(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 5)
    checkpoint = SIGNER.sign(chain.head(), T0)
    lanes.delete(entry_key(5))
    lanes.delete(entry_key(4))
    assert chain.verify().ok
    assert_fails(chain, 4, "truncated_before_checkpoint", checkpoint=checkpoint, verifier=VERIFIER)


def test_a_checkpoint_verifies_against_the_chain_that_grew_past_it(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 3)
    checkpoint = SIGNER.sign(chain.head(), T0)
    chain.append([body(4), body(5)])
    outcome = chain.verify(checkpoint, VERIFIER)
    assert outcome.ok and outcome.entries == 5


def test_a_checkpoint_of_the_empty_chain_verifies(lanes: LevelDBLaneStore) -> None:
    chain = EvidenceChain(lanes)
    checkpoint = SIGNER.sign(chain.head(), T0)
    assert chain.verify(checkpoint, VERIFIER).ok
    chain.append([body(1)])
    assert chain.verify(checkpoint, VERIFIER).ok


def test_a_rechained_edit_contradicts_the_checkpoint(lanes: LevelDBLaneStore) -> None:
    chain, entries = filled(lanes, 5)
    checkpoint = SIGNER.sign(ChainHead(seq=4, hash=entries[3]["hash"]), T0)
    # The attacker edits entry 2 and recomputes every hash after it: the chain links again.
    prev_hash = entries[0]["hash"]
    for entry in entries[1:]:
        changed = entry | {"prev_hash": prev_hash}
        if entry["seq"] == 2:
            changed["decision"] = "forged"
        forged = rehashed(changed)
        rewrite(lanes, entry["seq"], forged)
        prev_hash = forged["hash"]
    assert chain.verify().ok
    assert_fails(chain, 4, "checkpoint_mismatch", checkpoint=checkpoint, verifier=VERIFIER)


def test_a_checkpoint_signed_by_another_key_is_refused(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 3)
    forged = CheckpointSigner(b"\x06" * 32).sign(chain.head(), T0)
    assert_fails(chain, None, "checkpoint_signature_invalid", checkpoint=forged, verifier=VERIFIER)


def test_a_checkpoint_with_a_tampered_field_is_refused(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 5)
    checkpoint = SIGNER.sign(chain.head(), T0)
    lanes.delete(entry_key(5))
    # Moving the checkpoint back to hide the truncation breaks its signature.
    moved = checkpoint.model_copy(update={"seq": 4})
    assert_fails(chain, None, "checkpoint_signature_invalid", checkpoint=moved, verifier=VERIFIER)


def test_a_checkpoint_needs_a_verifier(lanes: LevelDBLaneStore) -> None:
    chain, _ = filled(lanes, 1)
    with pytest.raises(ValueError, match="verifier"):
        chain.verify(SIGNER.sign(chain.head(), T0))


# Retention


def old_and_new(lanes: LevelDBLaneStore) -> tuple[EvidenceChain, list[dict[str, Any]]]:
    """Entries 1-3 recorded on day 1, entries 4-5 on day 10."""
    chain = EvidenceChain(lanes)
    day = timedelta(days=1)
    bodies = [body(n, at=T0 + day) for n in (1, 2, 3)] + [body(n, at=T0 + 10 * day) for n in (4, 5)]
    return chain, chain.append(bodies)


def test_prune_removes_old_entries_from_the_start_and_anchors_the_rest(
    lanes: LevelDBLaneStore,
) -> None:
    chain, entries = old_and_new(lanes)
    assert chain.prune(T0 + timedelta(days=5), SIGNER, T0) == 3
    assert [entry["seq"] for entry in chain.scan()] == [4, 5]
    assert chain.anchor() == ChainHead(seq=3, hash=entries[2]["hash"])
    stored = RetentionAnchor.model_validate_json(lanes.get(ANCHOR_KEY) or b"")
    assert (stored.chain, stored.seq, stored.hash) == (NO_TENANT_CHAIN, 3, entries[2]["hash"])
    assert (stored.origin, stored.signed_at, stored.key_id) == (
        "retention",
        format_timestamp(T0),
        SIGNER.key_id,
    )
    outcome = chain.verify(verifier=VERIFIER)
    assert outcome.ok and outcome.entries == 2 and outcome.head_hash == entries[4]["hash"]


def test_prune_with_nothing_old_deletes_nothing(lanes: LevelDBLaneStore) -> None:
    chain, _ = old_and_new(lanes)
    assert chain.prune(T0, SIGNER, T0) == 0
    assert lanes.get(ANCHOR_KEY) is None
    assert chain.anchor() == ChainHead(seq=0, hash=GENESIS_HASH)


def test_prune_keeps_the_newest_entry(lanes: LevelDBLaneStore) -> None:
    chain, entries = old_and_new(lanes)
    assert chain.prune(T0 + timedelta(days=100), SIGNER, T0) == 4
    assert list(chain.scan()) == [entries[4]]
    assert chain.head() == ChainHead(seq=5, hash=entries[4]["hash"])
    assert chain.verify(verifier=VERIFIER).ok
    assert chain.prune(T0 + timedelta(days=100), SIGNER, T0) == 0


def test_prune_stops_at_the_first_entry_that_is_not_old(lanes: LevelDBLaneStore) -> None:
    chain = EvidenceChain(lanes)
    day = timedelta(days=1)
    chain.append([body(1, at=T0), body(2, at=T0 + 9 * day), body(3, at=T0), body(4, at=T0)])
    assert chain.prune(T0 + 5 * day, SIGNER, T0) == 1
    assert [entry["seq"] for entry in chain.scan()] == [2, 3, 4]


def test_prune_deletes_and_anchors_in_one_batch(lanes: LevelDBLaneStore) -> None:
    chain, entries = old_and_new(lanes)
    with failing_after(lanes, 2), pytest.raises(OSError):
        chain.prune(T0 + timedelta(days=5), SIGNER, T0)
    assert list(chain.scan()) == entries
    assert lanes.get(ANCHOR_KEY) is None
    assert chain.verify(verifier=VERIFIER).ok


def test_prune_never_erases_evidence_of_tampering(lanes: LevelDBLaneStore) -> None:
    chain, entries = old_and_new(lanes)
    rewrite(lanes, 2, entries[1] | {"decision": "forged"})
    assert chain.prune(T0 + timedelta(days=5), SIGNER, T0) == 1
    assert_fails(chain, 2, "hash_mismatch")


def test_prune_needs_an_aware_time(lanes: LevelDBLaneStore) -> None:
    chain, _ = old_and_new(lanes)
    with pytest.raises(ValueError, match="timezone-aware"):
        chain.prune(datetime(2030, 1, 1), SIGNER, T0)


def test_a_checkpoint_from_before_pruning_still_verifies(lanes: LevelDBLaneStore) -> None:
    chain, entries = old_and_new(lanes)
    at_kept = SIGNER.sign(ChainHead(seq=4, hash=entries[3]["hash"]), T0)
    at_anchor = SIGNER.sign(ChainHead(seq=3, hash=entries[2]["hash"]), T0)
    chain.prune(T0 + timedelta(days=5), SIGNER, T0)
    for checkpoint in (at_kept, at_anchor):
        assert chain.verify(checkpoint, VERIFIER).ok


def test_a_checkpoint_older_than_the_anchor_proves_nothing_and_says_so(
    lanes: LevelDBLaneStore,
) -> None:
    chain, entries = old_and_new(lanes)
    at_pruned = SIGNER.sign(ChainHead(seq=2, hash=entries[1]["hash"]), T0)
    chain.prune(T0 + timedelta(days=5), SIGNER, T0)
    result = chain.verify(at_pruned, VERIFIER)
    assert result.ok is False
    assert result.problem == "checkpoint_before_anchor"
    assert result.first_invalid_seq is None


def test_a_checkpoint_contradicting_the_anchor_fails(lanes: LevelDBLaneStore) -> None:
    chain, _ = old_and_new(lanes)
    chain.prune(T0 + timedelta(days=5), SIGNER, T0)
    wrong = SIGNER.sign(ChainHead(seq=3, hash=canonical_digest("other")), T0)
    assert_fails(chain, 3, "checkpoint_mismatch", checkpoint=wrong, verifier=VERIFIER)


def test_a_deleted_anchor_is_a_seq_gap(lanes: LevelDBLaneStore) -> None:
    chain, _ = old_and_new(lanes)
    chain.prune(T0 + timedelta(days=5), SIGNER, T0)
    lanes.delete(ANCHOR_KEY)
    assert_fails(chain, 1, "seq_gap")


def test_an_unreadable_anchor_is_anchor_invalid(lanes: LevelDBLaneStore) -> None:
    chain, _ = old_and_new(lanes)
    chain.prune(T0 + timedelta(days=5), SIGNER, T0)
    lanes.put(ANCHOR_KEY, b'{"seq":"' + CANARY.encode() + b'"}')
    outcome = chain.verify(verifier=VERIFIER)
    assert (outcome.ok, outcome.first_invalid_seq, outcome.problem) == (
        False,
        None,
        "anchor_invalid",
    )
    assert CANARY not in repr(outcome)
    with pytest.raises(ChainCorrupt) as raised:
        chain.prune(T0 + timedelta(days=50), SIGNER, T0)
    assert CANARY not in str(raised.value)


def test_a_restored_pruned_entry_contradicts_the_anchor(lanes: LevelDBLaneStore) -> None:
    chain, entries = old_and_new(lanes)
    chain.prune(T0 + timedelta(days=5), SIGNER, T0)
    rewrite(lanes, 2, entries[1])
    assert_fails(chain, 2, "anchor_invalid")


def test_a_prune_landing_mid_verify_is_not_reported_as_a_gap(
    lanes: LevelDBLaneStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The anchor is read before the entries: a prune in between must not look like tampering."""
    chain, _ = old_and_new(lanes)
    real_scan = lanes.scan
    pruned: list[int] = []

    def scan_after_a_prune(*args: Any, **kwargs: Any) -> Iterator[tuple[LaneKey, bytes]]:
        if not pruned:
            pruned.append(-1)  # before pruning: prune scans too
            pruned[0] = chain.prune(T0 + timedelta(days=5), SIGNER, T0)
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(lanes, "scan", scan_after_a_prune)
    assert chain.verify(verifier=VERIFIER).ok
    assert pruned == [3]


def test_appending_after_pruning_continues_the_seqs(lanes: LevelDBLaneStore) -> None:
    chain, entries = old_and_new(lanes)
    chain.prune(T0 + timedelta(days=100), SIGNER, T0)
    appended = chain.append([body(6)])
    assert appended[0]["seq"] == 6 and appended[0]["prev_hash"] == entries[4]["hash"]
    assert chain.verify(verifier=VERIFIER).ok


def test_the_anchor_alone_gives_the_head_of_an_emptied_lane(lanes: LevelDBLaneStore) -> None:
    """Retention keeps the newest entry; if it is gone anyway, the anchor still places appends."""
    chain, entries = old_and_new(lanes)
    chain.prune(T0 + timedelta(days=100), SIGNER, T0)
    lanes.delete(entry_key(5))
    assert chain.head() == ChainHead(seq=4, hash=entries[3]["hash"])


def forge_retention(lanes: LevelDBLaneStore, entries: list[dict[str, Any]], upto: int) -> None:
    """What an attacker who can write the store but not read the key does: delete the oldest
    entries and store the anchor retention would have stored, as older releases stored it."""
    for seq in range(1, upto + 1):
        lanes.delete(entry_key(seq))
    lanes.put(ANCHOR_KEY, canonical_json({"seq": upto, "hash": entries[upto - 1]["hash"]}))


def test_the_anchor_retention_signs_names_its_origin_in_the_answer(lanes: LevelDBLaneStore) -> None:
    chain, _ = old_and_new(lanes)
    chain.prune(T0 + timedelta(days=5), SIGNER, T0)
    outcome = chain.verify(verifier=VERIFIER)
    assert outcome.ok and outcome.anchor is not None
    assert (outcome.anchor.seq, outcome.anchor.origin) == (3, "retention")
    assert VERIFIER.verify_anchor(outcome.anchor, NO_TENANT_CHAIN)


def test_a_forged_unsigned_anchor_is_anchor_unsigned(lanes: LevelDBLaneStore) -> None:
    chain, entries = old_and_new(lanes)
    forge_retention(lanes, entries, 3)
    assert_fails(chain, None, "anchor_unsigned")
    assert chain.verify().problem == "anchor_unsigned"  # no key to check with changes nothing
    with pytest.raises(ChainCorrupt, match=r"not signed.*db upgrade"):
        chain.prune(T0 + timedelta(days=50), SIGNER, T0)  # retention does not vouch for it


@pytest.mark.parametrize("forgery", ["other-key", "other-chain", "edited", "no-verifier"])
def test_an_anchor_not_signed_for_this_chain_by_this_key_fails(
    lanes: LevelDBLaneStore, forgery: str
) -> None:
    chain, entries = old_and_new(lanes)
    forge_retention(lanes, entries, 3)
    start = ChainHead(seq=3, hash=entries[2]["hash"])
    signer = CheckpointSigner(b"\x06" * 32) if forgery == "other-key" else SIGNER
    name = "tenant-b" if forgery == "other-chain" else NO_TENANT_CHAIN
    anchor = signer.sign_anchor(name, start, "retention", T0).model_dump()
    if forgery == "edited":
        anchor["origin"] = "db_upgrade"
    lanes.put(ANCHOR_KEY, canonical_json(anchor))
    verifier = None if forgery == "no-verifier" else VERIFIER
    outcome = chain.verify(verifier=verifier)
    assert (outcome.ok, outcome.first_invalid_seq, outcome.problem) == (
        False,
        None,
        "anchor_signature_invalid",
    )
    assert outcome.anchor is None
    if forgery == "no-verifier":
        return  # a genuine anchor, checked with no key: retention with the key goes on
    with pytest.raises(ChainCorrupt, match="signature does not verify"):
        chain.prune(T0 + timedelta(days=50), SIGNER, T0)


def test_a_checkpoints_signature_never_passes_as_an_anchors(lanes: LevelDBLaneStore) -> None:
    chain, entries = old_and_new(lanes)
    forge_retention(lanes, entries, 3)
    checkpoint = SIGNER.sign(ChainHead(seq=3, hash=entries[2]["hash"]), T0)
    anchor = {
        "kind": "sessionstate.retention_anchor.v1",
        "chain": NO_TENANT_CHAIN,
        "seq": 3,
        "hash": entries[2]["hash"],
        "origin": "retention",
        "signed_at": checkpoint.issued_at,
        "key_id": checkpoint.key_id,
        "signature": checkpoint.signature,
    }
    lanes.put(ANCHOR_KEY, canonical_json(anchor))
    assert_fails(chain, None, "anchor_signature_invalid")
    signed = SIGNER.sign_anchor(
        NO_TENANT_CHAIN, ChainHead(seq=3, hash=entries[2]["hash"]), "retention", T0
    )
    as_checkpoint = checkpoint.model_copy(update={"signature": signed.signature})
    assert not VERIFIER.verify(as_checkpoint)


def test_a_resumed_walk_checks_the_anchor_too(lanes: LevelDBLaneStore) -> None:
    chain, entries = old_and_new(lanes)
    since = SIGNER.sign(ChainHead(seq=4, hash=entries[3]["hash"]), T0)
    chain.prune(T0 + timedelta(days=5), SIGNER, T0)
    assert chain.verify_resumed(since, VERIFIER).ok
    forge_retention(lanes, entries, 3)
    assert chain.verify_resumed(since, VERIFIER).problem == "anchor_unsigned"


def test_db_upgrade_signs_an_unsigned_anchor_once_the_chain_from_it_verifies(
    lanes: LevelDBLaneStore,
) -> None:
    chain, entries = old_and_new(lanes)
    forge_retention(lanes, entries, 3)  # as an older release's retention left it
    assert chain.sign_unsigned_anchor(SIGNER, T0 + timedelta(days=30)) is not None
    outcome = chain.verify(verifier=VERIFIER)
    assert outcome.ok and outcome.entries == 2
    assert outcome.anchor is not None and outcome.anchor.origin == "db_upgrade"
    assert chain.sign_unsigned_anchor(SIGNER, T0) is None  # nothing left to sign
    assert chain.prune(T0 + timedelta(days=100), SIGNER, T0) == 1  # retention goes on from it


def test_db_upgrade_leaves_unsigned_the_anchor_of_a_chain_that_does_not_verify(
    lanes: LevelDBLaneStore,
) -> None:
    chain, entries = old_and_new(lanes)
    forge_retention(lanes, entries, 3)
    rewrite(lanes, 5, entries[4] | {"decision": "forged"})
    walk = chain.sign_unsigned_anchor(SIGNER, T0)
    assert walk is not None and (walk.ok, walk.problem, walk.first_invalid_seq) == (
        False,
        "hash_mismatch",
        5,
    )
    assert lanes.get(ANCHOR_KEY) == canonical_json({"seq": 3, "hash": entries[2]["hash"]})
    assert_fails(chain, None, "anchor_unsigned")


# Any single edit is detected


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(min_value=-1e15, max_value=1e15)  # larger integral floats read back as ints
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)
BODY_FIELDS = st.dictionaries(
    st.text(max_size=8).filter(
        lambda name: name not in {"seq", "prev_hash", "hash", "recorded_at"}
    ),
    JSON_VALUES,
    max_size=4,
)


@contextmanager
def fresh_lanes() -> Iterator[LevelDBLaneStore]:
    with tempfile.TemporaryDirectory() as folder:
        store = LevelDBLaneStore(Path(folder) / "leveldb")
        try:
            yield store
        finally:
            store.close()


@settings(max_examples=50)
@given(
    bodies=st.lists(BODY_FIELDS, min_size=1, max_size=6),
    data=st.data(),
)
def test_any_single_edit_is_detected_at_or_before_its_seq(
    bodies: list[dict[str, Any]], data: st.DataObject
) -> None:
    with fresh_lanes() as lanes:
        chain = EvidenceChain(lanes)
        at = format_timestamp(T0)
        entries = chain.append([fields | {"recorded_at": at} for fields in bodies])
        assert chain.verify().ok
        victim = data.draw(st.sampled_from(entries), label="victim")
        edit = data.draw(st.sampled_from(["change", "add", "remove"]), label="edit")
        edited = dict(victim)
        if edit == "add":
            name = data.draw(st.text(max_size=8).filter(lambda n: n not in victim), label="name")
            edited[name] = data.draw(JSON_VALUES, label="value")
        else:
            name = data.draw(st.sampled_from(sorted(victim)), label="name")
            if edit == "remove":
                del edited[name]
            else:
                edited[name] = data.draw(JSON_VALUES, label="value")
                assume(canonical_json(edited[name]) != canonical_json(victim[name]))
        rewrite(lanes, victim["seq"], edited)
        outcome = chain.verify()
        assert not outcome.ok
        assert outcome.first_invalid_seq is not None
        assert outcome.first_invalid_seq <= victim["seq"]


@settings(max_examples=100)
@given(fields=BODY_FIELDS, data=st.data())
def test_members_encoded_ahead_seal_to_the_same_bytes(
    fields: dict[str, Any], data: st.DataObject
) -> None:
    """`seal(..., encoded_members=...)` (the journal encodes an entry's members in the request's
    thread) gives exactly what sealing the plain body gives, whichever members come encoded."""
    body_ = fields | {"recorded_at": format_timestamp(T0)}
    head = ChainHead(seq=6, hash=canonical_digest("earlier"))
    try:
        expected = seal([body_], head)
    except ValueError:
        assume(False)  # a body that cannot be sealed at all: nothing to compare
    names = data.draw(st.sets(st.sampled_from(sorted(body_))), label="encoded ahead")
    ahead = {name: Encoded.of(body_[name]) for name in names}
    assert seal([body_], head, encoded_members=[ahead]) == expected
