"""What a verify covered, and the scrub: the service walks each chain whole on its own, a part
at a time, resumably, and says so when an old entry no resumed verify re-reads was edited."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from service.policy.sidecar import OpaSidecar
from store.backends.contract import Lanes
from store.canonical import canonical_json
from store.chain.checkpoints import Checkpoint, CheckpointSigner
from store.chain.entry import parse_entry
from store.chain.evidence import EvidenceChain
from store.chain.full_walk import FullWalk, full_walk_key, last_full_walk
from store.chain.head import ChainHead, format_timestamp
from store.chain.keys import chain_name, entry_key
from store.chain.scrub_pass import scrub_position_key, scrub_step
from store.chain.signed_head import resumed_checkpoint
from store.secrets import SecretsHome
from tests.decisions.test_evidence_bundle import BUNDLE, sign_in
from tests.support.live import LiveService, live_service, service_settings

T0 = datetime(2025, 1, 1, tzinfo=UTC)
TENANT = "tenant-a"
VERIFY = "/v1/decisions/verify"


# --- the walk of one chain, a part at a time ---------------------------------------------


@pytest.fixture
def chain(lanes_on_both: Lanes) -> EvidenceChain:
    chain = EvidenceChain(lanes_on_both, TENANT)
    chain.append(
        [{"recorded_at": format_timestamp(T0 + timedelta(minutes=n))} for n in range(1, 11)]
    )
    return chain


def edit(chain: EvidenceChain, seq: int) -> None:
    """An entry changed in the store, its hash not recomputed."""
    entry = parse_entry(chain.lanes.get(entry_key(seq, chain.name)) or b"")
    assert entry is not None
    chain.lanes.put(entry_key(seq, chain.name), canonical_json(entry | {"forged": True}))


def position(chain: EvidenceChain, signer: CheckpointSigner) -> int | None:
    stored = chain.lanes.get(scrub_position_key(chain.name, signer.key_id))
    return None if stored is None else Checkpoint.model_validate_json(stored).seq


def test_a_walk_says_which_entries_it_read(chain: EvidenceChain, tmp_path: Path) -> None:
    whole = chain.verify()
    assert (whole.walked_from_seq, whole.walked_to_seq) == (1, 10)
    first = resumed_checkpoint(chain, SecretsHome.local(tmp_path), T0)
    assert first.checkpoint is not None
    nothing_new = chain.verify_resumed(first.checkpoint)
    assert (nothing_new.walked_from_seq, nothing_new.walked_to_seq) == (10, 10)
    chain.append([{"recorded_at": format_timestamp(T0 + timedelta(hours=1))}])
    resumed = chain.verify_resumed(first.checkpoint)
    assert (resumed.walked_from_seq, resumed.walked_to_seq) == (10, 11)
    edit(chain, 4)
    broken = chain.verify()
    assert (broken.walked_from_seq, broken.walked_to_seq, broken.first_invalid_seq) == (1, 4, 4)
    empty = EvidenceChain(chain.lanes, "tenant-empty").verify()
    assert empty.ok and (empty.walked_from_seq, empty.walked_to_seq) == (None, None)


def test_a_pass_goes_on_where_it_stopped(chain: EvidenceChain, tmp_path: Path) -> None:
    signer = CheckpointSigner.of(SecretsHome.local(tmp_path))
    assert scrub_step(chain, signer, T0, 3) is None
    assert position(chain, signer) == 3
    # A restart: a new signer of the same key goes on from seq 3, so an entry edited
    # before it is left to the next pass.
    again = CheckpointSigner.of(SecretsHome.local(tmp_path))
    edit(chain, 2)
    assert scrub_step(chain, again, T0, 3) is None
    assert position(chain, again) == 6
    assert scrub_step(chain, again, T0, 3) is None
    ended = scrub_step(chain, again, T0 + timedelta(minutes=1), 3)
    assert ended is not None and ended.ok and ended.by == "scrub" and ended.entries == 10
    assert position(chain, again) is None
    assert last_full_walk(chain, again.verifier()) == ended
    # the next pass begins at the anchor and finds the edit
    found = scrub_step(chain, again, T0 + timedelta(minutes=2), 100)
    assert found is not None and not found.ok
    assert (found.problem, found.first_invalid_seq, found.entries) == ("hash_mismatch", 2, 1)
    assert last_full_walk(chain, again.verifier()) == found


def test_a_pass_whose_position_was_cut_begins_again(chain: EvidenceChain, tmp_path: Path) -> None:
    signer = CheckpointSigner.of(SecretsHome.local(tmp_path))
    assert scrub_step(chain, signer, T0, 8) is None and position(chain, signer) == 8
    for seq in (7, 8, 9, 10):
        chain.lanes.delete(entry_key(seq, TENANT))
    ended = scrub_step(chain, signer, T0, 100)
    assert ended is not None and ended.ok and ended.entries == 6
    assert ended.checkpoint is not None and ended.checkpoint.seq == 6  # the head there is


def test_a_forged_position_starts_the_pass_again(chain: EvidenceChain, tmp_path: Path) -> None:
    """Someone who can write the store, not read the key, moves the pass past their edit."""
    signer = CheckpointSigner.of(SecretsHome.local(tmp_path))
    edit(chain, 2)
    mine = CheckpointSigner(b"\x07" * 32)
    head = ChainHead(seq=9, hash="sha256:" + "0" * 64)
    forged = mine.sign(head, T0, TENANT).model_copy(update={"key_id": signer.key_id})
    chain.lanes.put(scrub_position_key(TENANT, signer.key_id), canonical_json(forged.model_dump()))
    found = scrub_step(chain, signer, T0, 100)
    assert found is not None and (found.ok, found.first_invalid_seq) == (False, 2)


def test_a_forged_sound_walk_is_not_shown(chain: EvidenceChain, tmp_path: Path) -> None:
    signer = CheckpointSigner.of(SecretsHome.local(tmp_path))
    held = scrub_step(chain, signer, T0, 100)
    assert held is not None and held.ok and held.checkpoint is not None
    forged = held.model_copy(update={"at": format_timestamp(T0 + timedelta(days=1))})
    chain.lanes.put(full_walk_key(TENANT), canonical_json(forged.model_dump()))
    assert last_full_walk(chain, signer.verifier()) is None  # its checkpoint is of another time
    chain.lanes.put(full_walk_key(TENANT), b"\xff not a walk")
    assert last_full_walk(chain, signer.verifier()) is None


# --- end to end: an edited old entry, the default verify's answer and the next scrub --------


def auditor(service: LiveService) -> str:
    return service.token("auditor", sub="au-1", tenant=TENANT, workspace=None, session=None)


def verify(service: LiveService, *, full: bool = False) -> dict[str, Any]:
    answer = service.call("GET", VERIFY + ("?full=true" if full else ""), auditor(service))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def decide(service: LiveService, times: int) -> None:
    for _ in range(times):
        answer = service.call("GET", service.session_path() + "/state", service.token())
        assert answer.status_code == 404


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def events() -> Iterator[Events]:
    """The decision log's events, whoever configured the loggers' propagation."""
    handler = Events()
    logger = logging.getLogger("sessionstate.decisions")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def scrub_failures(service: LiveService) -> float:
    metrics = service.call("GET", "/metrics").text
    line = next(
        line
        for line in metrics.splitlines()
        if line.startswith("sessionstate_decision_scrub_failures_total ")
    )
    return float(line.split()[1])


def test_an_old_edited_entry_the_resumed_verify_skips_is_found_by_the_scrub(
    sidecar: OpaSidecar, tmp_path: Path, events: Events
) -> None:
    data_dir = tmp_path / "var"
    with live_service(sidecar, service_settings(data_dir, decision_scrub_seconds=0)) as service:
        assert service.context.scrub is None  # 0: no scrub
        decide(service, 5)
        first = verify(service)  # no head to resume from: the whole chain
        assert first["ok"] and first["resumed_from"] is None
        assert (first["walked_from_seq"], first["walked_to_seq"]) == (1, first["checkpoint"]["seq"])
        whole = first["last_full_walk"]
        assert whole["by"] == "verify" and whole["ok"] and whole["entries"] == first["entries"]
        assert whole["at"] == first["checkpoint"]["issued_at"]
        victim = 3  # before the head the verify signed
        lanes = service.context.lanes
        key = entry_key(victim, chain_name(TENANT))
        entry = parse_entry(lanes.get(key) or b"")
        assert entry is not None
        lanes.put(key, canonical_json(entry | {"outcome": {"status": 200, "applied": True}}))
        decide(service, 2)

        resumed = verify(service)
        assert resumed["ok"] is True  # it did not read seq 3 again ...
        assert resumed["resumed_from"]["seq"] == first["checkpoint"]["seq"]
        # ... and says so: what it read now, and the older whole walk that vouches for the rest
        assert resumed["walked_from_seq"] == first["checkpoint"]["seq"] > victim
        assert resumed["walked_to_seq"] == resumed["checkpoint"]["seq"]
        assert resumed["last_full_walk"] == whole
        assert service.call("GET", "/readyz").json()["warnings"] == []

    # Served again with a scrub every second: the next pass walks the whole chain.
    settings = service_settings(data_dir, decision_scrub_seconds=1)
    with live_service(sidecar, settings) as service:
        deadline = time.monotonic() + 30
        readiness = service.call("GET", "/readyz").json()
        while "decision_scrub_failed" not in readiness["warnings"] and time.monotonic() < deadline:
            time.sleep(0.1)
            readiness = service.call("GET", "/readyz").json()
        assert readiness["ready"] is True  # a warning: the service still serves
        assert "decision_scrub_failed" in readiness["warnings"]
        failed = [r for r in events.records if r.getMessage() == "decision_scrub_failed"]
        assert failed and failed[0].__dict__["chain"] == TENANT
        assert (failed[0].__dict__["problem"], failed[0].__dict__["seq"]) == ("hash_mismatch", 3)
        assert scrub_failures(service) >= 1

        after = verify(service)
        assert after["ok"] is True  # still resumed from the head signed before
        scrubbed = FullWalk.model_validate(after["last_full_walk"])
        assert (scrubbed.by, scrubbed.ok) == ("scrub", False)
        assert (scrubbed.first_invalid_seq, scrubbed.problem) == (victim, "hash_mismatch")
        assert scrubbed.at > whole["at"] and scrubbed.checkpoint is None
        # The page's own walk resumes and holds, but it offers no bundle: the whole chain
        # does not verify, and the download says so.
        page = sign_in(service, auditor(service))
        view = page.get(service.url + "/ui/decisions", timeout=10)
        assert view.status_code == 200 and "Chain verified" in view.text
        assert "Download evidence bundle" not in view.text and "No evidence bundle" in view.text
        assert page.get(service.url + BUNDLE, timeout=10).status_code == 409
        full = verify(service, full=True)
        assert (full["ok"], full["first_invalid_seq"]) == (False, victim)
        assert full["last_full_walk"]["by"] == "verify"

        # Mended (the entry put back as it was), a whole walk by a verify clears the warning
        # at once, without waiting for the next scrub.
        lanes = service.context.lanes
        lanes.put(key, canonical_json(entry))
        assert verify(service, full=True)["ok"] is True
        assert service.call("GET", "/readyz").json()["warnings"] == []
