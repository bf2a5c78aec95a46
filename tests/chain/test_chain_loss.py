"""Nothing is signed for a chain that no longer reaches its remembered signed head, and a cut
chain takes entries again (from the journal) only after its loss is recorded, as an entry
the walk accepts, and reports, while any other gap still fails. On LevelDB and on
PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from service.decisions.journal import ChainBehindSignedHead, DecisionJournal
from store.backends.contract import Lanes
from store.canonical import canonical_json
from store.chain.checkpoints import Checkpoint, CheckpointSigner
from store.chain.entry import parse_entry, seal
from store.chain.evidence import EvidenceChain
from store.chain.head import ChainHead, format_timestamp
from store.chain.keys import entry_key
from store.chain.signed_head import (
    NothingLost,
    SignedHeads,
    record_loss,
    resumed_checkpoint,
    verified_checkpoint,
    verified_head_key,
)
from store.chain.walk import ChainVerification
from store.digests import DigestKey
from store.secrets import SecretsHome
from store.session_state import Precondition, state_key
from tests.chain.test_verified_head import T0, TENANT, grown
from tests.support.factories import decision_entry_body, record, scope


@pytest.fixture
def lanes(lanes_on_both: Lanes) -> Lanes:
    return lanes_on_both


def stored(chain: EvidenceChain, seq: int) -> dict[str, Any]:
    entry = parse_entry(chain.lanes.get(entry_key(seq, chain.name)) or b"")
    assert entry is not None
    return entry


def cut(chain: EvidenceChain, first: int, last: int) -> None:
    for seq in range(first, last + 1):
        chain.lanes.delete(entry_key(seq, chain.name))


def losses(result: ChainVerification) -> list[tuple[int, int | None, int]]:
    return [(loss.seq, loss.lost_from_seq, loss.lost_to_seq) for loss in result.recorded_losses]


def loss_members() -> dict[str, Any]:
    return {
        "recorded_at": format_timestamp(T0 + timedelta(days=1)),
        "target": {"tenant_id": TENANT},
    }


@pytest.fixture
def chain(lanes: Lanes, tmp_path: Path) -> EvidenceChain:
    """A chain of 10 entries whose head a verify signed and remembered."""
    chain = EvidenceChain(lanes, TENANT)
    grown(chain, 1, 10)
    first = resumed_checkpoint(chain, SecretsHome.local(tmp_path), datetime.now(UTC))
    assert first.checkpoint is not None and first.checkpoint.seq == 10
    return chain


def signed_head(chain: EvidenceChain, data_dir: Path) -> Checkpoint:
    remembered = SignedHeads(SecretsHome.local(data_dir)).remembered(chain)
    assert remembered is not None
    return remembered


@pytest.mark.parametrize("full", [False, True])
def test_no_signer_signs_for_a_chain_cut_below_its_signed_head(
    chain: EvidenceChain, tmp_path: Path, full: bool
) -> None:
    cut(chain, 8, 10)
    result, checkpoint = verified_checkpoint(chain, SecretsHome.local(tmp_path), datetime.now(UTC))
    assert checkpoint is None
    assert (result.problem, result.first_invalid_seq) == ("truncated_before_checkpoint", 8)
    verified = resumed_checkpoint(chain, SecretsHome.local(tmp_path), datetime.now(UTC), full=full)
    assert verified.checkpoint is None and verified.result.problem == "truncated_before_checkpoint"
    assert SignedHeads(SecretsHome.local(tmp_path)).behind(chain)


def test_no_signer_signs_for_a_chain_that_re_used_the_signed_seqs(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    """The tail cut, then written over (what a service without this check did): the chain
    links, yet holds another entry at the signed head's seq."""
    cut(chain, 8, 10)
    grown(chain, 100, 5)  # seqs 8..12, re-used
    result, checkpoint = verified_checkpoint(chain, SecretsHome.local(tmp_path), datetime.now(UTC))
    assert checkpoint is None
    assert (result.problem, result.first_invalid_seq) == ("checkpoint_mismatch", 10)
    assert SignedHeads(SecretsHome.local(tmp_path)).behind(chain)


def test_a_chain_that_reaches_its_signed_head_is_not_behind_and_has_nothing_to_record(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    grown(chain, 11, 3)
    assert not SignedHeads(SecretsHome.local(tmp_path)).behind(chain)
    with pytest.raises(NothingLost):
        record_loss(chain, SecretsHome.local(tmp_path), loss_members())
    assert chain.head().seq == 13


def test_a_recorded_cut_keeps_the_covered_seqs_unused_and_verifies_with_the_loss_reported(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    head = signed_head(chain, tmp_path)
    seven = stored(chain, 7)
    cut(chain, 8, 10)
    entry = record_loss(chain, SecretsHome.local(tmp_path), loss_members())
    assert (entry["seq"], entry["prev_hash"]) == (11, head.head_hash)  # after the signed head
    assert entry["loss"]["follows"] == {"seq": 7, "hash": seven["hash"]}
    assert (entry["loss"]["lost_from_seq"], entry["loss"]["lost_to_seq"]) == (8, 10)
    assert entry["loss"]["signed_head"] == head.model_dump()
    assert not SignedHeads(SecretsHome.local(tmp_path)).behind(chain)
    grown(chain, 11, 2)  # the chain takes entries again: 12, 13
    assert chain.head().seq == 13

    keys = CheckpointSigner.of(SecretsHome.local(tmp_path)).verifier()
    walked = chain.verify(None, keys)  # the loss entry's signed head is checked with the key
    assert walked.ok and walked.head_seq == 13
    assert chain.verify().problem == "loss_invalid"  # without the key it cannot be told
    assert losses(walked) == [(11, 8, 10)]
    # A checkpoint a reviewer kept of the signed head still verifies, through the loss entry.
    assert chain.verify(head, CheckpointSigner.of(SecretsHome.local(tmp_path)).verifier()).ok
    resumed = resumed_checkpoint(chain, SecretsHome.local(tmp_path), datetime.now(UTC))
    assert resumed.checkpoint is not None and resumed.checkpoint.seq == 13
    assert losses(resumed.result) == [(11, 8, 10)]
    full = resumed_checkpoint(chain, SecretsHome.local(tmp_path), datetime.now(UTC), full=True)
    assert full.checkpoint is not None and losses(full.result) == [(11, 8, 10)]
    # Every walk counts the entries there are (7, the loss entry, 12 and 13), not the seqs.
    assert walked.entries == resumed.result.entries == full.result.entries == 10
    _, checkpoint = verified_checkpoint(chain, SecretsHome.local(tmp_path), datetime.now(UTC))
    assert checkpoint is not None and checkpoint.seq == 13
    grown(chain, 13, 1)
    later = resumed_checkpoint(
        chain, SecretsHome.local(tmp_path), datetime.now(UTC)
    )  # from 13, past the loss
    assert (later.result.entries, losses(later.result)) == (11, [(11, 8, 10)])


def test_a_checkpoint_of_a_lost_seq_is_named(chain: EvidenceChain, tmp_path: Path) -> None:
    signer = CheckpointSigner.of(SecretsHome.local(tmp_path))
    at_eight = signer.sign(ChainHead(seq=8, hash=stored(chain, 8)["hash"]), T0, TENANT)
    cut(chain, 8, 10)
    record_loss(chain, SecretsHome.local(tmp_path), loss_members())
    result = chain.verify(at_eight, signer.verifier())
    assert (result.ok, result.problem, result.first_invalid_seq) == (
        False,
        "checkpoint_in_recorded_loss",
        8,
    )


def test_a_gap_the_loss_entry_does_not_record_still_fails(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    cut(chain, 8, 10)
    record_loss(chain, SecretsHome.local(tmp_path), loss_members())
    grown(chain, 11, 3)  # 12..14
    chain.lanes.delete(entry_key(5, TENANT))  # a gap no entry records
    assert (chain.verify().problem, chain.verify().first_invalid_seq) == ("seq_gap", 5)


def test_a_forged_loss_entry_covers_nothing(chain: EvidenceChain, tmp_path: Path) -> None:
    """A loss entry that does not follow the last entry before its gap is a gap like any."""
    cut(chain, 8, 10)
    entry = record_loss(chain, SecretsHome.local(tmp_path), loss_members())
    cut(chain, 6, 7)  # now the entry does not follow seq 5
    assert (chain.verify().problem, chain.verify().first_invalid_seq) == ("seq_gap", 6)
    stranger = dict(entry, loss=dict(entry["loss"], lost_from_seq=3))  # says other seqs
    chain.lanes.put(entry_key(11, TENANT), canonical_json(stranger))
    assert chain.verify().problem == "seq_gap"


def test_a_loss_entry_naming_a_head_the_key_never_signed_is_invalid(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    """Whoever can write the store but not read the key cannot record a loss: the signed
    head a loss entry names must verify under the key, as the remembered one did."""
    cut(chain, 8, 10)
    entry = record_loss(chain, SecretsHome.local(tmp_path), loss_members())
    stranger = CheckpointSigner(b"\x07" * 32)  # another key signs the same head
    forged_head = stranger.sign(ChainHead(seq=10, hash=entry["prev_hash"]), T0, TENANT)
    body = {
        name: value for name, value in entry.items() if name not in ("seq", "prev_hash", "hash")
    }
    body["loss"] = dict(entry["loss"], signed_head=forged_head.model_dump())
    chain.lanes.delete(entry_key(11, TENANT))
    (forged,), _ = seal([body], ChainHead(seq=10, hash=entry["prev_hash"]), TENANT)
    chain.lanes.put(forged.key, forged.value)
    keys = CheckpointSigner.of(SecretsHome.local(tmp_path)).verifier()
    result = chain.verify(None, keys)
    assert (result.ok, result.problem, result.first_invalid_seq) == (False, "loss_invalid", 11)


def test_a_recorded_re_use_supersedes_the_signed_head(chain: EvidenceChain, tmp_path: Path) -> None:
    head = signed_head(chain, tmp_path)
    cut(chain, 8, 10)
    grown(chain, 100, 4)  # seqs 8..11 re-used before the loss was recorded
    entry = record_loss(chain, SecretsHome.local(tmp_path), loss_members())
    assert (entry["seq"], entry["prev_hash"]) == (12, stored(chain, 11)["hash"])
    assert entry["loss"]["lost_from_seq"] is None and entry["loss"]["lost_to_seq"] == 10
    assert entry["loss"]["signed_head"] == head.model_dump()
    key = verified_head_key(TENANT, head.key_id)
    assert chain.lanes.get(key) is None  # superseded: it is in the chain now
    assert not SignedHeads(SecretsHome.local(tmp_path)).behind(chain)
    verified = resumed_checkpoint(chain, SecretsHome.local(tmp_path), datetime.now(UTC))
    assert verified.checkpoint is not None and verified.checkpoint.seq == 12
    assert losses(verified.result) == [(12, None, 10)]


def test_without_a_remembered_head_there_is_nothing_to_record(lanes: Lanes, tmp_path: Path) -> None:
    chain = EvidenceChain(lanes, TENANT)
    grown(chain, 1, 3)
    with pytest.raises(NothingLost):
        record_loss(chain, SecretsHome.local(tmp_path), loss_members())
    assert not SignedHeads(SecretsHome.local(tmp_path)).behind(chain)


def test_the_journal_takes_nothing_on_a_chain_behind_its_signed_head_until_the_loss_is_recorded(
    chain: EvidenceChain, tmp_path: Path
) -> None:
    """Other chains go on; the chain's write stores nothing; on PostgreSQL the loss is
    recorded while the journal runs, and its next entry is taken after the loss entry."""
    cut(chain, 8, 10)
    journal = DecisionJournal(chain.lanes, signed_heads=SignedHeads(SecretsHome.local(tmp_path)))
    try:
        with pytest.raises(ChainBehindSignedHead):
            journal.record(decision_entry_body("decision-a1", TENANT), status=200)
        target = scope(tenant=TENANT)
        written = record(DigestKey(b"k" * 32), target)
        with pytest.raises(ChainBehindSignedHead):
            journal.record_write(
                decision_entry_body("decision-a2", TENANT),
                written,
                Precondition(if_none_match_any=True),
            )
        assert chain.lanes.get(state_key(target)) is None
        assert chain.head().seq == 7
        other = journal.record(decision_entry_body("decision-b1", "tenant-b"), status=200)
        assert other["seq"] == 1
        assert journal.chains_behind_signed_head() == 1

        record_loss(chain, SecretsHome.local(tmp_path), loss_members())
        taken = journal.record(decision_entry_body("decision-a3", TENANT), status=200)
        assert taken["seq"] == 12  # after the loss entry (11), which follows the signed head
        assert journal.chains_behind_signed_head() == 0
        assert chain.verify(None, CheckpointSigner.of(SecretsHome.local(tmp_path)).verifier()).ok
    finally:
        journal.close()
