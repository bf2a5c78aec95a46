"""Checkpoint notes timestamped by a real RFC 3161 authority, end to end: OpenSSL's own TSA
(`openssl ts -reply`, tests/support/tsa.py) behind a small HTTP front, the service (real
HTTP, real OPA) asking it for each new note on its 1 s job, and the served reply checked by
the real `openssl ts -verify` against the served note's signed text.

While the TSA answers a 500 or garbage, nothing is kept: a log event and a metric each
round, and `GET /v1/decisions/checkpoint/timestamp` is a 404. Once it answers, the route
serves the reply for the note `GET /v1/decisions/checkpoint` serves, and `?tree_size=N`
an older one. The tests poll with a generous deadline; nothing asserts how long anything
took.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from service.policy.sidecar import OpaSidecar
from store.chain.note import SignedNote
from store.chain.timestamp_store import TimestampRejected, covered, timestamped_sizes
from store.chain.tlog_checkpoint import TreeHead
from tests.http.test_http_log_proofs import TENANT, flipped, get, traffic
from tests.http.test_http_log_witnesses import events, until
from tests.support.live import LiveService, live_service, service_settings
from tests.support.tsa import Tsa, openssl_tsa

ORIGIN = "log.test/timestamped"
TIMESTAMP = "/v1/decisions/checkpoint/timestamp"


def failures(service: LiveService, reason: str) -> float:
    text = service.http.get(service.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'sessionstate_log_timestamp_failures_total{{reason="{reason}"}} '):
            return float(line.split()[-1])
    return 0.0


def signed_text(note: bytes) -> bytes:
    """The note's signed text: the lines before the blank line (what the log key signs)."""
    text = note.split(b"\n\n", 1)[0] + b"\n"
    assert text.decode() == TreeHead.parse(SignedNote.parse(note).text).text()
    return text


def size_of(note: bytes) -> int:
    return TreeHead.parse(SignedNote.parse(note).text).size


def not_found(service: LiveService, **params: str) -> None:
    answer = get(service, TIMESTAMP, **params)
    assert answer.status_code == 404, answer.text
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert answer.json()["reason"] == "checkpoint_timestamp_not_found"


def served_pair(service: LiveService) -> tuple[bytes, bytes] | None:
    """The served note and the served timestamp, once the reply covers that note (the job
    may timestamp a newer note between the two requests: then asked again)."""
    note = get(service, "/v1/decisions/checkpoint")
    reply = get(service, TIMESTAMP)
    if reply.status_code != 200:
        return None
    assert reply.headers["Content-Type"] == "application/timestamp-reply"
    assert reply.headers["Sessionstate-Decision-Id"]
    try:
        covered(reply.content, signed_text(note.content))
    except TimestampRejected:
        return None
    return bytes(note.content), bytes(reply.content)


def openssl_verify(tmp: Path, tsa: Tsa, text: bytes, reply: bytes) -> bool:
    """`openssl ts -verify -data <signed text> -in <reply> -CAfile <ca.pem>`, for real."""
    (tmp / "signed.txt").write_bytes(text)
    (tmp / "reply.tsr").write_bytes(reply)
    command = ["openssl", "ts", "-verify", "-data", str(tmp / "signed.txt")]
    command += ["-in", str(tmp / "reply.tsr"), "-CAfile", str(tsa.ca)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert ("Verification: OK" in done.stdout) == (done.returncode == 0), done
    return done.returncode == 0


def test_checkpoints_are_timestamped_on_the_clock_and_openssl_verifies_them(
    sidecar: OpaSidecar, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sessionstate.decisions")
    with openssl_tsa(tmp_path / "tsa") as tsa:
        tsa.mode = "error"
        settings = service_settings(
            tmp_path / "var",
            log_origin=ORIGIN,
            log_checkpoint_seconds=1,
            tsa_url=tsa.url,
            tsa_ca_file=tsa.ca,
        )
        with live_service(sidecar, settings) as service:
            traffic(service)
            # A TSA that answers 500: an event and a metric each round, nothing kept.
            until(lambda: failures(service, "unreachable") >= 1 or None, "a 500 counted")
            failed = events(caplog, "log_timestamp_failed")
            assert failed and failed[0].reason == "unreachable"  # type: ignore[attr-defined]
            unstamped = size_of(get(service, "/v1/decisions/checkpoint").content)
            not_found(service)
            not_found(service, tree_size=str(unstamped))
            tsa.mode = "garbage"  # a reply that does not read: invalid, nothing kept
            until(lambda: failures(service, "invalid") >= 1 or None, "garbage counted")
            assert timestamped_sizes(service.context.lanes, TENANT) == []
            not_found(service)

            tsa.mode = "ok"  # asked again next round: kept, served with its note
            note, reply = until(lambda: served_pair(service), "a timestamped checkpoint")
            assert events(caplog, "log_timestamp_kept")
            text = signed_text(note)
            assert openssl_verify(tmp_path, tsa, text, reply)
            assert not openssl_verify(tmp_path, tsa, flipped(text, len(text) // 2), reply)
            assert not openssl_verify(tmp_path, tsa, text, flipped(reply, len(reply) - 40))

            # An older note's timestamp, by its size, once a newer note has one.
            older = size_of(note)
            traffic(service, writes=1)
            until(
                lambda: max(timestamped_sizes(service.context.lanes, TENANT)) > older or None,
                "a newer note timestamped",
            )
            again = get(service, TIMESTAMP, tree_size=str(older))
            assert (again.status_code, again.content) == (200, reply)
            kept = get(service, "/v1/decisions/checkpoint", tree_size=str(older)).content
            assert openssl_verify(tmp_path, tsa, signed_text(kept), again.content)
            not_found(service, tree_size=str(unstamped))  # that note was never timestamped
            answer = get(service, TIMESTAMP, tree_size="987654321")
            assert (answer.status_code, answer.json()["reason"]) == (422, "proof_out_of_range")
            assert "987654321" not in answer.text
    assert tsa.queries >= 3


def test_without_a_tsa_no_checkpoint_has_a_timestamp(sidecar: OpaSidecar, tmp_path: Path) -> None:
    settings = service_settings(tmp_path / "var", log_origin=ORIGIN)
    with live_service(sidecar, settings) as service:
        traffic(service, writes=1)
        assert get(service, "/v1/decisions/checkpoint").status_code == 200
        not_found(service)
        denied = service.http.get(
            service.url + TIMESTAMP,
            headers={"Authorization": f"Bearer {service.token()}"},  # not an auditor
            timeout=30,
        )
        assert denied.status_code == 403, denied.text
