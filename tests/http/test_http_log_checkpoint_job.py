"""The checkpoint job signs nothing for a broken chain, end to end: a service (real HTTP,
real OPA, LevelDB) with a real litewitness and OpenSSL's own TSA configured, its 1 s job
signing, submitting and timestamping notes, then an entry after the newest note edited in
the store.

From then on no round signs a note of the broken chain, so no witness is asked to cosign
it and no TSA to timestamp it: the log event `log_checkpoint_unverified` (once per head)
and `sessionstate_log_checkpoint_failures_total{reason="chain_unverified"}`, and the
checkpoint route answers 409 `chain_unverified`. The tests poll with a generous deadline;
nothing asserts how long anything took.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from service.policy.sidecar import OpaSidecar
from store.chain.log_note import LogSigner, latest_note
from store.chain.timestamp_store import timestamped_sizes
from store.chain.witness_store import cosigned_sizes
from store.secrets import SecretsHome
from tests.http.test_http_log_proofs import TENANT, edit_entry, get, traffic
from tests.http.test_http_log_witnesses import (
    ORIGIN,
    events,
    head_size,
    one_witness,
    until,
    witnessed_settings,
)
from tests.support.live import LiveService, live_service
from tests.support.tsa import openssl_tsa

ROUNDS_WATCHED = 3  # rounds of the 1 s job after the failure is first counted


def failures(service: LiveService) -> float:
    text = service.http.get(service.url + "/metrics", timeout=10).text
    wanted = 'sessionstate_log_checkpoint_failures_total{reason="chain_unverified"} '
    for line in text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    return 0.0


def newest(service: LiveService) -> tuple[int, int, int]:
    """The newest note's size, the newest cosigned size and the newest timestamped size,
    read from the store (a request would itself be a decision that grows the chain)."""
    lanes = service.context.lanes
    note = latest_note(
        lanes, LogSigner.of(SecretsHome.local(service.context.settings.data_dir), ORIGIN), TENANT
    )
    cosigned, stamped = cosigned_sizes(lanes, TENANT), timestamped_sizes(lanes, TENANT)
    return (
        note.head.size if note else 0,
        max(cosigned, default=0),
        max(stamped, default=0),
    )


def all_caught_up(service: LiveService) -> int | None:
    """The head's size once its note is signed, cosigned and timestamped."""
    size = head_size(service)
    return size if newest(service) == (size, size, size) else None


def test_the_job_signs_submits_and_timestamps_no_note_of_a_broken_chain(
    sidecar: OpaSidecar,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sessionstate.decisions")
    with (
        openssl_tsa(tmp_path / "tsa") as tsa,
        one_witness(tmp_path) as (witness, data_dir),
    ):
        settings = witnessed_settings(data_dir, [witness], tsa_url=tsa.url)
        with live_service(sidecar, settings) as service:
            traffic(service)
            size = until(lambda: all_caught_up(service), "a note signed, cosigned, stamped")
            queries = tsa.queries
            traffic(service, writes=1)  # entries after the note, one of them then edited
            edit_entry(service, size + 2)

            until(lambda: failures(service) >= 1 or None, "the broken chain counted")
            watched_from = failures(service)
            time.sleep(ROUNDS_WATCHED)  # later rounds: the same head is not tried again
            assert failures(service) == watched_from == 1
            assert newest(service) == (size, size, size)  # nothing signed, sent or stamped
            assert tsa.queries == queries
            (event,) = events(caplog, "log_checkpoint_unverified")
            assert event.chain == TENANT  # type: ignore[attr-defined]
            assert event.problem == "hash_mismatch"  # type: ignore[attr-defined]
            answer = get(service, "/v1/decisions/checkpoint")
            assert (answer.status_code, answer.json()["reason"]) == (409, "chain_unverified")
