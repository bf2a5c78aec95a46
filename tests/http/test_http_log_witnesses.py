"""Checkpoint notes made on a clock and cosigned by a real witness nobody here wrote, end to end.

The service (real HTTP, real OPA) signs each grown chain's note every second
(SESSIONSTATE_LOG_CHECKPOINT_SECONDS=1) and submits it to a running litewitness
(tests/support/witness.py, torchwood v0.6.1): the served checkpoint then carries the
witness's cosignature, which Go's `logcheck` and the Python verifier accept, and the
witness follows the grown tree through consistency proofs. After the data dir's log is
rewritten offline and re-signed with the data dir's own key, the witness refuses the
new head: a log event, a metric and a /readyz warning, and verify's `witnessed` does
not vouch for it. The tests poll with a generous deadline (the job runs on its own
thread); nothing asserts how long anything took.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from service.cli import main
from service.config.store import configured_store
from service.policy.sidecar import OpaSidecar
from store.chain.checkpoints import CheckpointSigner
from store.chain.cosignature import witness_cosignature
from store.chain.evidence import EvidenceChain
from store.chain.keys import tree_key
from store.chain.log_note import LogSigner
from store.chain.note import SignedNote, VerifierKey, open_note
from store.chain.signed_head import verified_head_key
from store.chain.tlog_checkpoint import TreeHead
from store.key_codec import TenantResourceLane
from store.secrets import SecretsHome
from tests.http.test_http_log_proofs import TENANT, get, logcheck, traffic
from tests.support.damage import rechained, rewrite, stored
from tests.support.live import LiveService, live_service, service_settings
from tests.support.witness import Witness, litewitness

ORIGIN = "log.test/witnessed"
CHAIN_ORIGIN = f"{ORIGIN}/{TENANT}"
DEADLINE_SECONDS = 60
T = TypeVar("T")


def until(found: Callable[[], T | None], what: str) -> T:
    """`found()` once it is not None, polled; fails after a generous deadline."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while (value := found()) is None:
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)
    return value


def log_vkey(data_dir: Path) -> str:
    """The data dir's note verifier key (the key made now, before the service starts)."""
    return str(LogSigner.of(SecretsHome.local(data_dir), ORIGIN).verifier_key)


def witnessed_settings(data_dir: Path, witnesses: list[Witness], **overrides: Any) -> Any:
    listed = [{"vkey": w.vkey, "url": w.url} for w in witnesses]
    return service_settings(
        data_dir,
        log_origin=ORIGIN,
        log_checkpoint_seconds=1,
        log_witnesses=json.dumps(listed),
        **overrides,
    )


def served(service: LiveService) -> tuple[bytes, str]:
    answer = get(service, "/v1/decisions/checkpoint")
    assert answer.status_code == 200, answer.text
    return bytes(answer.content), answer.headers["Sessionstate-Witnessed"]


def cosigned_note(service: LiveService, size: int) -> bytes | None:
    """The served note, once it carries the one witness's cosignature and signs `size`
    entries or more (each read is a decision of the chain too: it keeps growing)."""
    note, header = served(service)
    grown = TreeHead.parse(SignedNote.parse(note).text).size >= size
    return note if header == "1/1" and grown else None


def witnessed(service: LiveService) -> dict[str, Any]:
    answer = get(service, "/v1/decisions/verify")
    assert answer.status_code == 200, answer.text
    head: dict[str, Any] = answer.json()["witnessed"]
    return head


def metric(service: LiveService, name: str, witness: Witness) -> float:
    text = service.http.get(service.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{witness="{witness.name}"}} '):
            return float(line.split()[-1])
    return 0.0


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.getMessage() == event]


def head_size(service: LiveService) -> int:
    return EvidenceChain(service.context.lanes, TENANT).head().seq


@contextmanager
def one_witness(tmp_path: Path) -> Iterator[tuple[Witness, Path]]:
    data_dir = tmp_path / "var"
    with litewitness(tmp_path / "w1", {CHAIN_ORIGIN: log_vkey(data_dir)}) as witness:
        yield witness, data_dir


def rewrite_offline(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What whoever holds the data dir can do with the service stopped: edit one decision,
    re-chain every entry after it, forget the signed heads, notes and witness state the
    service kept, and rebuild the tree (`db upgrade`), all with the data dir's own key."""
    lanes = configured_store(service_settings(data_dir)).open()
    try:
        chain = EvidenceChain(lanes, TENANT)
        head = chain.head().seq
        edited = stored(chain, 2) | {"recorded_at": "2020-01-01T00:00:00.000Z"}
        rewrite(chain, 2, edited)  # one decision's body changed...
        rechained(chain, 2, head)  # ...and every hash and link from it recomputed
        key_id = CheckpointSigner.of(SecretsHome.local(data_dir)).key_id
        with lanes.batch(sync=True) as batch:
            batch.delete(verified_head_key(TENANT, key_id))
            for key, _ in lanes.scan(TenantResourceLane.TRACE_META, TENANT):
                if key.name.startswith((b"note", b"cosig")):  # notes, lines, witness sizes
                    batch.delete(key)
            for key, _ in lanes.scan(TenantResourceLane.MERKLE_NODE, TENANT):
                batch.delete(key)
            batch.delete(tree_key(TENANT))
    finally:
        lanes.close()
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["db", "upgrade"]) == 0


def test_a_witness_cosigns_notes_made_on_the_clock_and_refuses_a_rewritten_log(
    sidecar: OpaSidecar,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sessionstate.decisions")
    with one_witness(tmp_path) as (witness, data_dir):
        settings = witnessed_settings(data_dir, [witness])
        wkey = VerifierKey.parse(witness.vkey)
        with live_service(sidecar, settings) as service:
            traffic(service)
            size = head_size(service)
            # The job signs the grown chain's note and the witness cosigns it.
            note = until(
                lambda: cosigned_note(service, size),
                "the served checkpoint carries the witness's cosignature",
            )
            head = TreeHead.parse(open_note(note, VerifierKey.parse(log_vkey(data_dir))).text)
            assert head.origin == CHAIN_ORIGIN and head.size >= 1
            cosignature = witness_cosignature(note, wkey)  # the Python verifier accepts it
            assert cosignature.witness == witness.name
            (tmp_path / "note").write_bytes(note)
            base = ["--vkey", log_vkey(data_dir), "--origin", CHAIN_ORIGIN]
            assert logcheck("checkpoint", *base, tmp_path / "note")
            now = witnessed(service)  # this note, or a newer one cosigned since (reads grow it)
            assert now["tree_size"] >= head.size
            assert now | {"tree_size": head.size} == {
                "tree_size": head.size,
                "cosigned_by": [witness.name],
                "quorum": 1,
                "met": True,
            }
            # The kept note of that size, with its cosignature.
            older = get(service, "/v1/decisions/checkpoint", tree_size=str(head.size))
            assert (older.status_code, older.content) == (200, note)

            traffic(service, writes=2)  # the witness follows the grown tree (a consistency proof)
            grown = head_size(service)
            assert grown > size
            until(
                lambda: witness.logs()[CHAIN_ORIGIN]["size"] >= grown or None,
                "the witness cosigned the grown tree",
            )
            assert metric(service, "sessionstate_log_witness_cosignatures_total", witness) >= 2
            final = until(lambda: cosigned_note(service, grown), "the grown note, cosigned")
            assert witness_cosignature(final, wkey).witness == witness.name
            ready = service.http.get(service.url + "/readyz", timeout=10).json()
            assert "log_witness_refused" not in ready["warnings"]
        honest = witness.logs()[CHAIN_ORIGIN]

        rewrite_offline(data_dir, monkeypatch)
        caplog.clear()
        with live_service(sidecar, settings) as service:
            # The job signs the rewritten head (it verifies: every hash was recomputed)...
            assert get(service, "/v1/decisions/verify").json()["ok"] is True
            # ...and the witness, asked from 0, answers the size it knows (409), then
            # refuses the proof from there (422): the rewritten tree does not extend it.
            refused = until(
                lambda: events(caplog, "log_witness_refused") or None, "the witness refuses"
            )
            assert (refused[0].witness, refused[0].status) == (witness.name, 422)  # type: ignore[attr-defined]
            assert metric(service, "sessionstate_log_witness_refusals_total", witness) >= 1
            ready = service.http.get(service.url + "/readyz", timeout=10).json()
            assert "log_witness_refused" in ready["warnings"]
            assert witnessed(service) == {
                "tree_size": None,
                "cosigned_by": [],
                "quorum": 1,
                "met": False,
            }
            note, header = served(service)
            assert header == "0/1"  # the rewritten head, with no cosignature
            assert SignedNote.parse(note).signatures_of(wkey) == []
        assert witness.logs()[CHAIN_ORIGIN] == honest  # it still holds the honest head


def test_a_quorum_of_two_is_not_met_while_one_witness_is_down(
    sidecar: OpaSidecar, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sessionstate.decisions")
    data_dir = tmp_path / "var"
    logs = {CHAIN_ORIGIN: log_vkey(data_dir)}
    with litewitness(tmp_path / "w1", logs) as up:
        with litewitness(tmp_path / "w2", logs, name="witness.test/w2") as down:
            pass  # stopped: its URL no longer answers
        both = witnessed_settings(data_dir, [up, down], log_witness_quorum=2)
        with live_service(sidecar, both) as service:
            traffic(service, writes=1)
            until(
                lambda: witnessed(service)["cosigned_by"] == [up.name] or None,
                "the running witness cosigned",
            )
            assert witnessed(service) | {"tree_size": 1} == {
                "tree_size": 1,
                "cosigned_by": [up.name],
                "quorum": 2,
                "met": False,
            }
            until(lambda: events(caplog, "log_witness_unreachable") or None, "unreachable")
            assert events(caplog, "log_witness_refused") == []
            assert metric(service, "sessionstate_log_witness_unreachable_total", down) >= 1
            assert metric(service, "sessionstate_log_witness_refusals_total", down) == 0
            note, header = served(service)  # no note has the quorum: the latest, as cosigned
            assert header in ("0/2", "1/2")
            ready = service.http.get(service.url + "/readyz", timeout=10).json()
            assert "log_witness_refused" not in ready["warnings"]
        one = witnessed_settings(data_dir, [up, down], log_witness_quorum=1)
        with live_service(sidecar, one) as service:
            now = witnessed(service)
            assert (now["cosigned_by"], now["quorum"], now["met"]) == ([up.name], 1, True)
            note, header = until(
                lambda: ((answer := served(service))[1] == "1/1" and answer) or None,
                "the note the one witness cosigned is served",
            )
            assert witness_cosignature(note, VerifierKey.parse(up.vkey)).witness == up.name


def test_a_kept_note_is_served_by_its_size_within_bounds(
    sidecar: OpaSidecar, tmp_path: Path
) -> None:
    # The clock's first round is a minute away: notes are signed only when asked for.
    settings = service_settings(tmp_path / "var", log_origin=ORIGIN)
    with live_service(sidecar, settings) as service:
        traffic(service, writes=1)
        first = get(service, "/v1/decisions/checkpoint")
        assert first.status_code == 200 and "Sessionstate-Witnessed" not in first.headers
        size = TreeHead.parse(SignedNote.parse(first.content).text).size
        traffic(service, writes=1)
        assert get(service, "/v1/decisions/checkpoint").status_code == 200
        again = get(service, "/v1/decisions/checkpoint", tree_size=str(size))
        assert (again.status_code, again.content) == (200, first.content)
        for tree_size, status, reason in [
            (str(size - 1), 404, "checkpoint_note_not_found"),
            ("987654321", 422, "proof_out_of_range"),
            ("0", 422, "validation_failed"),
            ("x", 422, "validation_failed"),
        ]:
            answer = get(service, "/v1/decisions/checkpoint", tree_size=tree_size)
            assert (answer.status_code, answer.json()["reason"]) == (status, reason), tree_size
            assert "987654321" not in answer.text
