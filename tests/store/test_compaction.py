"""Compaction: the window, the summary's hash chain, v1 records, and writes tied to their base."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from service.config.settings import Settings
from service.decisions.journal import DecisionJournal
from service.decisions.log import DecisionEntryBody
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_json, sha256_digest
from store.digests import DigestKey
from store.record.blockers import Blocker, CorruptionLabel
from store.record.bounds import MAX_SAFE_INTEGER
from store.record.builder import build_record
from store.record.compaction import compact, extend
from store.record.inputs import SessionStateInput
from store.record.state_record import (
    GENESIS_DIGEST,
    NO_COMPACTED_TURNS,
    CompactedTurns,
    SessionStateRecord,
    SessionTurnDigest,
    compute_state_digest,
)
from store.record.validation import record_blockers
from store.session_state import (
    NOTHING_STORED,
    ParsedRecords,
    Precondition,
    PreconditionFailed,
    SessionStateStore,
    StoredVersion,
    read_report,
    state_key,
)
from tests.support.factories import decision_entry_body, record, scope, state_input, v1_record_bytes
from tests.support.paths import ROOT

DIGEST = "sha256:" + "cd" * 32


def turns(count: int, start: int = 0) -> list[dict[str, Any]]:
    """Turns as a model service sends them, with digests it computed itself."""
    return [
        {
            "turn_id": f"turn-{n}",
            "role": "user" if n % 2 == 0 else "assistant",
            "payload_digest": sha256_digest(f"text {n}".encode()),
            "token_estimate": n % 7,
        }
        for n in range(start, start + count)
    ]


def chain(sent: list[dict[str, Any]]) -> str:
    """The summary digest, computed as docs/model-service.md says, from the turns alone."""
    digest = "sha256:" + "0" * 64
    for turn in sent:
        line = f"{digest}\n{turn['turn_id']}\n{turn['role']}\n{turn['payload_digest']}"
        digest = "sha256:" + hashlib.sha256(line.encode("utf-8")).hexdigest()
    return digest


def built(key: DigestKey, sent: list[dict[str, Any]], **options: Any) -> SessionStateRecord:
    state = SessionStateInput.model_validate(state_input(turns=sent))
    return build_record(scope(), state, key, **options)


def digests(sent: list[dict[str, Any]]) -> list[SessionTurnDigest]:
    return [SessionTurnDigest.model_validate(turn) for turn in sent]


# --- the window and the summary -----------------------------------------------------------


def test_a_record_within_the_window_keeps_every_turn_and_an_empty_summary(
    digest_key: DigestKey,
) -> None:
    kept = built(digest_key, turns(16), turns_kept=16)
    assert [turn.turn_id for turn in kept.turns] == [f"turn-{n}" for n in range(16)]
    assert kept.compacted_turns == NO_COMPACTED_TURNS
    assert kept.to_json()["compacted_turns"] == {
        "count": 0,
        "token_estimate": 0,
        "digest": "sha256:" + "0" * 64,
    }


def test_the_oldest_turns_beyond_the_window_go_into_the_summary(digest_key: DigestKey) -> None:
    sent = turns(20)
    kept = built(digest_key, sent, turns_kept=16)
    assert [turn.turn_id for turn in kept.turns] == [f"turn-{n}" for n in range(4, 20)]
    assert kept.compacted_turns == CompactedTurns(
        count=4, token_estimate=sum(n % 7 for n in range(4)), digest=chain(sent[:4])
    )
    assert record_blockers(kept) == []


def test_a_write_extends_the_summary_it_is_based_on(digest_key: DigestKey) -> None:
    history = turns(40)
    first = built(digest_key, history[:20], turns_kept=16)
    kept = [turn.model_dump() for turn in first.turns]
    second = built(digest_key, kept + history[20:], compacted=first.summary, turns_kept=16)
    assert second.summary.count + len(second.turns) == 40
    assert second.summary.digest == chain(history[:24])
    assert second.summary.token_estimate == sum(n % 7 for n in range(24))


def test_the_digest_changes_with_a_gap_a_reordering_a_relabelling_or_a_role_swap() -> None:
    sent = turns(4)
    same_text = [dict(sent[0], payload_digest=DIGEST), dict(sent[1], payload_digest=DIGEST)]
    variants = [
        sent,
        sent[:1] + sent[2:],  # a gap
        [sent[1], sent[0], *sent[2:]],  # a reordering
        [dict(sent[0], turn_id="turn-x"), *sent[1:]],  # a relabelled turn
        same_text,
        [dict(same_text[0], role="assistant"), dict(same_text[1], role="user")],  # roles swapped
    ]
    found = [extend(NO_COMPACTED_TURNS, digests(variant)).digest for variant in variants]
    assert len(set(found)) == len(found)
    assert found[0] == chain(sent)


def test_compaction_keeps_the_newest_and_never_fails_on_a_huge_estimate() -> None:
    heavy = CompactedTurns(count=3, token_estimate=MAX_SAFE_INTEGER - 1, digest=DIGEST)
    summary, kept = compact(heavy, digests(turns(5, start=1)), keep=2)
    assert [turn.turn_id for turn in kept] == ["turn-4", "turn-5"]
    assert summary.count == 6 and summary.token_estimate == MAX_SAFE_INTEGER
    assert compact(heavy, digests(turns(2)), keep=2) == (heavy, digests(turns(2)))
    with pytest.raises(ValueError):
        compact(heavy, [], keep=0)


def test_the_window_setting_has_bounds() -> None:
    assert Settings().max_turns_kept == 256
    assert Settings(max_turns_kept=16).max_turns_kept == 16
    for outside in (15, 1025):
        with pytest.raises(ValidationError):
            Settings(max_turns_kept=outside)


def test_a_write_may_carry_a_full_record_and_as_many_new_turns() -> None:
    SessionStateInput.model_validate(state_input(turns=turns(2048)))
    with pytest.raises(ValidationError):
        SessionStateInput.model_validate(state_input(turns=turns(2049)))
    with pytest.raises(ValidationError):  # a summary is the service's to make, never sent
        SessionStateInput.model_validate(state_input(compacted_turns=NO_COMPACTED_TURNS))


# --- validation of the summary's shape ----------------------------------------------------


def _reshaped(key: DigestKey, **change: Any) -> SessionStateRecord:
    """A built record with members changed (None: removed), its state digest recomputed."""
    content = record(key).content() | change
    content = {name: value for name, value in content.items() if value is not None}
    return SessionStateRecord.model_validate_json(json.dumps(_with_digest(content)), strict=True)


def _with_digest(content: dict[str, Any]) -> dict[str, Any]:
    return content | {"state_digest": compute_state_digest(content)}


@pytest.mark.parametrize(
    "change",
    [
        {"compacted_turns": None},  # a v2 record without its summary
        {"schema": "sessionstate.record.v1"},  # a v1 record with one
        {"compacted_turns": {"count": 0, "token_estimate": 3, "digest": GENESIS_DIGEST}},
        {"compacted_turns": {"count": 0, "token_estimate": 0, "digest": DIGEST}},
        {"compacted_turns": {"count": 2, "token_estimate": 0, "digest": GENESIS_DIGEST}},
    ],
)
def test_a_summary_of_the_wrong_shape_blocks(digest_key: DigestKey, change: Any) -> None:
    assert record_blockers(_reshaped(digest_key, **change)) == [Blocker.COMPACTED_TURNS_INVALID]


def test_a_summary_of_an_unknown_schema_is_a_schema_mismatch_only(digest_key: DigestKey) -> None:
    changed = _reshaped(digest_key, schema="sessionstate.record.v9", compacted_turns=None)
    assert record_blockers(changed) == [Blocker.SCHEMA_MISMATCH]


def test_the_summary_digest_is_a_sha256_digest(digest_key: DigestKey) -> None:
    keyed = {"count": 1, "token_estimate": 0, "digest": digest_key.digest_text("x")}
    with pytest.raises(ValidationError):
        _reshaped(digest_key, compacted_turns=keyed)


# --- v1 records ---------------------------------------------------------------------------


def test_a_v1_record_reads_exactly_as_stored(digest_key: DigestKey) -> None:
    stored, digest = v1_record_bytes(digest_key)
    report = read_report(scope(), state_key(scope()).digest(), stored)
    assert report.corrupt is False and report.record is not None
    v1 = report.record
    assert (v1.schema_, v1.compacted_turns, v1.summary) == (
        "sessionstate.record.v1",
        None,
        NO_COMPACTED_TURNS,
    )
    assert v1.state_digest == digest == v1.computed_state_digest()
    assert canonical_json(v1.to_json()) == stored
    assert "compacted_turns" not in json.loads(v1.model_dump_json())
    assert record_blockers(v1) == []


def test_a_v1_record_given_a_summary_on_disk_is_corrupt(digest_key: DigestKey) -> None:
    stored, _ = v1_record_bytes(digest_key)
    content = json.loads(stored)
    del content["state_digest"]
    content["compacted_turns"] = NO_COMPACTED_TURNS.model_dump()
    tampered = canonical_json(_with_digest(content))
    report = read_report(scope(), state_key(scope()).digest(), tampered)
    assert report.redacted_error == CorruptionLabel.VALIDATION_FAILED


# --- a write is tied to the version its summary extends -----------------------------------


ONE, TWO = StoredVersion("sha256:" + "1" * 64), StoredVersion("sha256:" + "2" * 64)
SUMMARISED = StoredVersion(
    "sha256:" + "3" * 64, CompactedTurns(count=1, token_estimate=0, digest=DIGEST)
)


def test_a_record_with_a_summary_is_written_only_over_the_version_it_extends(
    digest_key: DigestKey,
) -> None:
    long = built(digest_key, turns(17), turns_kept=16)
    tied = Precondition().extending(long, ONE)
    assert tied.holds(ONE)
    assert not tied.holds(TWO) and not tied.holds(NOTHING_STORED)
    created = Precondition(if_none_match_any=True).extending(long, NOTHING_STORED)
    assert created.holds(NOTHING_STORED) and not created.holds(ONE)
    both = Precondition(if_match=TWO.version).extending(long, ONE)  # read ONE, named TWO
    assert not both.holds(ONE) and not both.holds(TWO)


def test_a_record_without_a_summary_never_replaces_one(digest_key: DigestKey) -> None:
    short = Precondition().extending(built(digest_key, turns(2)), ONE)
    assert short.holds(ONE) and short.holds(TWO) and short.holds(NOTHING_STORED)
    assert not short.holds(SUMMARISED)  # a summary another writer made meanwhile stays


def test_the_base_of_a_write_is_the_stored_version_and_its_summary(
    state_store: SessionStateStore, lanes: LevelDBLaneStore, digest_key: DigestKey
) -> None:
    assert state_store.base(scope()).version is None
    assert state_store.base(scope()).compacted == NO_COMPACTED_TURNS
    long = built(digest_key, turns(20), turns_kept=16)
    state_store.write(long)
    assert state_store.base(scope()).version == long.state_digest
    assert state_store.base(scope()).compacted == long.compacted_turns
    stored, digest = v1_record_bytes(digest_key)
    lanes.put(state_key(scope()), stored)
    assert (state_store.base(scope()).version, state_store.base(scope()).compacted) == (
        digest,
        NO_COMPACTED_TURNS,
    )
    lanes.put(state_key(scope()), b"not a record")
    assert state_store.base(scope()).version == sha256_digest(b"not a record")


def test_an_unconditional_write_tied_to_a_version_replaced_meanwhile_fails(
    state_store: SessionStateStore, lanes: LevelDBLaneStore, digest_key: DigestKey
) -> None:
    """What the route does for a write without If-Match whose summary extends the stored one."""
    history = turns(22)
    state_store.write(built(digest_key, history[:16], turns_kept=16))
    base = state_store.base(scope())  # read when the write came in
    mine = built(digest_key, history[:18], compacted=base.compacted, turns_kept=16)
    theirs = built(digest_key, history[:16] + history[18:20], turns_kept=16)
    state_store.write(theirs)  # another writer lands first, compacting the same two turns
    journal = DecisionJournal(lanes)
    try:
        unconditional = Precondition().extending(mine, base)
        result = journal.record_write(entry("d-1"), mine, unconditional)
        assert result.applied is False and result.entry["outcome"]["status"] == 412
        with pytest.raises(PreconditionFailed):
            state_store.write(mine, unconditional)
        fresh = state_store.base(scope())  # the retry builds on what is stored now
        kept = [turn.model_dump() for turn in theirs.turns]
        retried = built(digest_key, kept + history[20:], compacted=fresh.compacted, turns_kept=16)
        again = journal.record_write(
            entry("d-2"), retried, Precondition().extending(retried, fresh)
        )
        assert again.applied is True
    finally:
        journal.close()
    assert retried.summary.count == 4  # turn-0 and turn-1 counted once, by the first writer
    assert retried.summary.digest == chain(history[:4])
    assert retried.summary.count + len(retried.turns) == 20


def entry(decision_id: str) -> DecisionEntryBody:
    return decision_entry_body(decision_id)


# --- one parse per exchange ---------------------------------------------------------------


def test_a_record_is_parsed_once_for_the_same_bytes_and_afresh_for_others(
    state_store: SessionStateStore, lanes: LevelDBLaneStore, digest_key: DigestKey
) -> None:
    written = built(digest_key, turns(20), turns_kept=16)
    state_store.write(written)
    first, second = state_store.read(scope()), state_store.read(scope())
    assert first is not None and second is not None
    assert first.record is second.record is written  # the write left its record to be read
    stored = lanes.get(state_key(scope()))
    assert stored is not None
    lanes.put(state_key(scope()), stored.replace(b'"count":4', b'"count":5'))
    tampered = state_store.read(scope())
    assert tampered is not None and tampered.corrupt is True
    assert read_report(scope("tenant-b"), "sha256:" + "0" * 64, stored).corrupt is True


def test_the_parsed_records_kept_are_bounded() -> None:
    kept = ParsedRecords(sessions=2)
    records = [record(DigestKey(b"k" * 32), scope(session=f"s-{n}")) for n in range(3)]
    for one in records:
        kept.remember(one, b"bytes of " + one.scope.session_id.encode())
    assert kept.get(records[0].scope, b"bytes of s-0") is None
    assert kept.get(records[2].scope, b"bytes of s-2") is records[2]
    assert kept.get(records[2].scope, b"other bytes") is None


# --- the recipe docs/model-service.md gives -----------------------------------------------


def test_the_documented_recipe_recomputes_the_summary_digest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = (ROOT / "docs" / "model-service.md").read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", page, re.DOTALL)
    at = next(n for n, (kind, text) in enumerate(blocks) if "def summary_digest" in text)
    assert blocks[at][0] == "python" and blocks[at + 1][0] == "text"
    namespace: dict[str, Any] = {}
    exec(blocks[at][1], namespace)
    printed = capsys.readouterr().out.strip()
    assert printed == blocks[at + 1][1].strip()
    ours = extend(
        NO_COMPACTED_TURNS, digests([t | {"token_estimate": 0} for t in namespace["turns"]])
    )
    assert printed == ours.digest
    assert (
        namespace["summary_digest"](turns(40))
        == extend(NO_COMPACTED_TURNS, digests(turns(40))).digest
    )
