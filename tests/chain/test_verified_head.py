"""A verify that resumes from the last verified head: it walks only what was appended since,
yet still finds tampering after that head, a rewrite or a cut that reaches it, and a
remembered head that was itself rewritten. On LevelDB and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from store.backends.contract import Lanes
from store.canonical import canonical_json
from store.chain.checkpoints import CheckpointSigner
from store.chain.evidence import EvidenceChain
from store.chain.head import ChainHead, format_timestamp
from store.chain.keys import anchor_key, entry_key
from store.chain.signed_head import Verified, resumed_checkpoint, verified_head_key
from store.secrets import SecretsHome
from tests.support.damage import rechained, rehashed, rewrite, stored

T0 = datetime(2025, 1, 1, tzinfo=UTC)
TENANT = "tenant-a"


@pytest.fixture
def lanes(lanes_on_both: Lanes) -> Lanes:
    return lanes_on_both


def body(n: int) -> dict[str, Any]:
    return {"recorded_at": format_timestamp(T0 + timedelta(minutes=n)), "decision": f"d{n}"}


def grown(chain: EvidenceChain, start: int, count: int) -> None:
    chain.append([body(n) for n in range(start, start + count)])


def walked(chain: EvidenceChain, data_dir: Path, *, full: bool = False) -> Verified:
    return resumed_checkpoint(chain, SecretsHome.local(data_dir), datetime.now(UTC), full=full)


@pytest.fixture
def chain(lanes: Lanes, tmp_path: Path) -> EvidenceChain:
    """A chain of 10 entries whose head a first (whole) walk remembered."""
    chain = EvidenceChain(lanes, TENANT)
    grown(chain, 1, 10)
    first = walked(chain, tmp_path)
    assert first.result.ok and first.resumed_from is None and first.checkpoint is not None
    assert first.checkpoint.seq == 10
    return chain


def test_a_second_verify_resumes_from_the_head_the_first_signed(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    grown(chain, 11, 5)
    again = walked(chain, tmp_path)
    assert again.resumed_from is not None and again.resumed_from.seq == 10
    assert again.result.ok and again.result.entries == 15 and again.result.head_seq == 15
    assert again.result.head_hash == stored(chain, 15)["hash"]
    assert again.checkpoint is not None and again.checkpoint.seq == 15
    # and remembers the new head for the next walk
    third = walked(chain, tmp_path)
    assert third.resumed_from == again.checkpoint and third.result.entries == 15


def test_tampering_after_the_remembered_head_is_found(chain: EvidenceChain, tmp_path: Path) -> None:
    grown(chain, 11, 5)
    rewrite(chain, 12, stored(chain, 12) | {"decision": "forged"})
    outcome = walked(chain, tmp_path)
    assert outcome.resumed_from is not None
    assert (outcome.result.ok, outcome.result.first_invalid_seq) == (False, 12)
    assert outcome.result.problem == "hash_mismatch"
    assert outcome.checkpoint is None
    assert outcome.result.entries == 11  # 10 verified before, 11 now: the ones before seq 12


@pytest.mark.parametrize(
    ("tamper", "seq", "problem"),
    [
        ("rehash 13", 14, "prev_hash_mismatch"),
        ("delete 13", 13, "seq_gap"),
        ("swap 12 and 13", 12, "seq_mismatch"),
    ],
)
def test_every_kind_of_tampering_after_the_head_is_named(
    chain: EvidenceChain, tmp_path: Path, tamper: str, seq: int, problem: str
) -> None:
    grown(chain, 11, 5)
    if tamper == "rehash 13":
        rewrite(chain, 13, rehashed(stored(chain, 13), decision="forged"))
    elif tamper == "delete 13":
        chain.lanes.delete(entry_key(13, TENANT))
    else:
        twelve, thirteen = stored(chain, 12), stored(chain, 13)
        rewrite(chain, 12, thirteen)
        rewrite(chain, 13, twelve)
    outcome = walked(chain, tmp_path)
    assert outcome.resumed_from is not None
    assert (outcome.result.problem, outcome.result.first_invalid_seq) == (problem, seq)


def test_a_rewrite_that_reaches_the_remembered_head_is_found(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    grown(chain, 11, 5)
    rechained(chain, 4, 15, decision="forged")  # the whole tail, re-hashed and re-linked
    outcome = walked(chain, tmp_path)
    assert (outcome.result.problem, outcome.result.first_invalid_seq) == (
        "checkpoint_mismatch",
        10,
    )
    assert outcome.checkpoint is None


def test_a_tail_cut_below_the_remembered_head_is_found(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    for seq in (9, 10):
        chain.lanes.delete(entry_key(seq, TENANT))
    outcome = walked(chain, tmp_path)
    assert (outcome.result.problem, outcome.result.first_invalid_seq) == (
        "truncated_before_checkpoint",
        9,
    )
    # a whole walk alone cannot see a cut tail: the remembered head is what shows it, so a
    # whole walk is held against it too, and signs nothing
    whole = walked(chain, tmp_path, full=True)
    assert (whole.result.problem, whole.checkpoint) == ("truncated_before_checkpoint", None)
    assert walked(chain, tmp_path).result.problem == "truncated_before_checkpoint"


def test_a_rewritten_remembered_head_is_not_trusted(chain: EvidenceChain, tmp_path: Path) -> None:
    """Someone who can write the store but has not the checkpoint key edits entry 3, re-chains
    the rest, and remembers a head of their own, signed with a key of their own."""
    grown(chain, 11, 5)
    rewrite(chain, 3, stored(chain, 3) | {"decision": "forged"})
    rechained(chain, 4, 15)
    mine = CheckpointSigner(b"\x07" * 32)
    own_key = CheckpointSigner.of(SecretsHome.local(tmp_path)).key_id
    forged = mine.sign(ChainHead(seq=15, hash=stored(chain, 15)["hash"]), T0, TENANT)
    forged = forged.model_copy(update={"key_id": own_key})  # claims the service's key
    chain.lanes.put(verified_head_key(TENANT, own_key), canonical_json(forged.model_dump()))
    outcome = walked(chain, tmp_path)
    assert outcome.resumed_from is None  # rejected: the whole chain was walked
    assert (outcome.result.problem, outcome.result.first_invalid_seq) == ("hash_mismatch", 3)


@pytest.mark.parametrize(
    "forgery", ["not json", "another tenant's head", "a head moved on", "unsigned fields"]
)
def test_a_remembered_head_that_does_not_hold_is_ignored(
    chain: EvidenceChain, tmp_path: Path, forgery: str
) -> None:
    signer = CheckpointSigner.of(SecretsHome.local(tmp_path))
    key = verified_head_key(TENANT, signer.key_id)
    genuine = walked(chain, tmp_path).checkpoint
    assert genuine is not None
    rewrite(chain, 5, stored(chain, 5) | {"decision": "forged"})  # before the head
    if forgery == "not json":
        value = b"\xff not a checkpoint"
    elif forgery == "another tenant's head":  # genuinely signed, for another chain
        other = EvidenceChain(chain.lanes, "tenant-b")
        grown(other, 1, 20)
        theirs = walked(other, tmp_path).checkpoint
        assert theirs is not None
        value = canonical_json(theirs.model_dump())
    elif forgery == "a head moved on":  # the signed fields changed, the signature kept
        value = canonical_json(genuine.model_dump() | {"seq": 10_000})
    else:
        value = canonical_json(genuine.model_dump() | {"head_hash": "sha256:" + "e" * 64})
    chain.lanes.put(key, value)
    outcome = walked(chain, tmp_path)
    assert outcome.resumed_from is None
    assert (outcome.result.problem, outcome.result.first_invalid_seq) == ("hash_mismatch", 5)


def test_an_older_genuine_head_only_makes_the_walk_longer(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    signer = CheckpointSigner.of(SecretsHome.local(tmp_path))
    key = verified_head_key(TENANT, signer.key_id)
    old = chain.lanes.get(key)
    grown(chain, 11, 5)
    assert walked(chain, tmp_path).checkpoint is not None  # remembers seq 15
    rewrite(chain, 12, stored(chain, 12) | {"decision": "forged"})
    chain.lanes.put(key, old or b"")  # put back the head of seq 10
    outcome = walked(chain, tmp_path)
    assert outcome.resumed_from is not None and outcome.resumed_from.seq == 10
    assert (outcome.result.problem, outcome.result.first_invalid_seq) == ("hash_mismatch", 12)


def test_a_resumed_walk_does_not_read_entries_before_the_head_and_says_so(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    """What resuming covers: an entry edited before the remembered head (its hash not
    recomputed) shows only in a whole walk."""
    rewrite(chain, 5, stored(chain, 5) | {"decision": "forged"})
    resumed = walked(chain, tmp_path)
    assert resumed.resumed_from is not None and resumed.result.ok
    whole = walked(chain, tmp_path, full=True)
    assert whole.resumed_from is None
    assert (whole.result.problem, whole.result.first_invalid_seq) == ("hash_mismatch", 5)


def test_after_retention_passed_the_head_the_walk_starts_at_the_anchor(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    grown(chain, 11, 5)
    assert (
        chain.prune(
            T0 + timedelta(minutes=12), CheckpointSigner.of(SecretsHome.local(tmp_path)), T0
        )
        == 11
    )  # seqs 1..11 go, the anchor is 11
    outcome = walked(chain, tmp_path)
    assert outcome.result.ok and outcome.result.entries == 4 and outcome.result.head_seq == 15


def test_a_remembered_head_at_the_anchor_must_match_it(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    grown(chain, 11, 5)
    assert (
        chain.prune(
            T0 + timedelta(minutes=11), CheckpointSigner.of(SecretsHome.local(tmp_path)), T0
        )
        == 10
    )  # the anchor is seq 10: the head
    other = ChainHead(seq=10, hash="sha256:" + "a" * 64)  # signed, but not the chain's seq 10
    forged = CheckpointSigner.of(SecretsHome.local(tmp_path)).sign_anchor(
        TENANT, other, "retention", T0
    )
    chain.lanes.put(anchor_key(TENANT), canonical_json(forged.model_dump()))
    outcome = walked(chain, tmp_path)
    assert not outcome.result.ok and outcome.result.first_invalid_seq == 10
