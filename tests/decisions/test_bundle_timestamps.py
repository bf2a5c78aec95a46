"""Evidence bundles carry the checkpoint's RFC 3161 timestamp: the reply OpenSSL's own TSA
(tests/support/tsa.py) gave the service's 1 s job, over the bundle's note when that note
has one, else over the newest older timestamped note, shipped with the consistency proof
that the bundle's tree extends it.

The shipped `verify.py` (the system's `python3 -I`, a clean directory) checks that the
reply names the SHA-256 of the note's signed text and, given `--tsa-ca`, has the real
`openssl ts -verify` accept it; one flipped bit in the reply or in the timestamped note
fails. The tests poll with a generous deadline; nothing asserts how long anything took.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from service.policy.sidecar import OpaSidecar
from store.chain.log_note import LogSigner, latest_note
from store.chain.timestamp_store import timestamp_of
from store.secrets import SecretsHome
from tests.decisions.test_bundle_log_proofs import (
    bundle_offline,
    download,
    manifest_log,
    refused,
    verified,
)
from tests.decisions.test_evidence_bundle import run_verifier
from tests.http.test_http_log_proofs import TENANT, b64_flipped, flipped, traffic
from tests.http.test_http_log_witnesses import head_size, until
from tests.support.live import LiveService, live_service, service_settings
from tests.support.tsa import Tsa, openssl_tsa

ORIGIN = "log.test/stamped-bundles"
STAMPED_FILES = {"timestamped.note", "timestamp-consistency.json"}


def _stamped_at_head(service: LiveService) -> int | None:
    """The head's size once its note's timestamp is kept (read from the store: a request
    would itself be a decision that grows the chain)."""
    lanes, size = service.context.lanes, head_size(service)
    note = latest_note(
        lanes, LogSigner.of(SecretsHome.local(service.context.settings.data_dir), ORIGIN), TENANT
    )
    if note is None or note.head.size != size:
        return None
    return size if timestamp_of(lanes, TENANT, note) is not None else None


def _with_ca(folder: Path, tsa: Tsa) -> str:
    done = run_verifier(folder, "--tsa-ca", str(tsa.ca))
    assert done.returncode == 0, done.stderr
    return done.stdout


def _refused_with_ca(folder: Path, tsa: Tsa) -> str:
    done = run_verifier(folder, "--tsa-ca", str(tsa.ca))
    assert done.returncode == 1, done.stdout
    return done.stderr


def test_a_bundle_carries_the_checkpoints_timestamp_and_openssl_verifies_it(
    sidecar: OpaSidecar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with openssl_tsa(tmp_path / "tsa") as tsa:
        settings = service_settings(
            tmp_path / "var", log_origin=ORIGIN, log_checkpoint_seconds=1, tsa_url=tsa.url
        )
        with live_service(sidecar, settings) as service:
            traffic(service)
            head = until(lambda: _stamped_at_head(service), "the head's note, timestamped")
            downloaded = download(service, tmp_path / "downloaded")
            tsa.mode = "error"  # no newer note is timestamped from here on
            traffic(service, writes=1)
        monkeypatch.setenv("SESSIONSTATE_LOG_ORIGIN", ORIGIN)
        offline = bundle_offline(settings.data_dir, tmp_path / "offline", monkeypatch)

        # Downloaded (signing in and the page are no decisions), the bundle's head is the
        # timestamped one: the reply is over its own note.
        log = manifest_log(downloaded)
        assert (log["tree_size"], log["timestamped_size"]) == (head, head)
        names = {path.name for path in downloaded.iterdir()}
        assert "timestamp.tsr" in names and not STAMPED_FILES & names
        said = _with_ca(downloaded, tsa)
        assert (
            f"timestamp  over checkpoint.note's signed text (tree size {head}); "
            f"openssl ts -verify: OK under {tsa.ca.name}"
        ) in said
        assert "its signature not checked: pass --tsa-ca" in verified(downloaded)
        readme = (downloaded / "README.md").read_text()
        assert "openssl ts -verify -data signed.txt -in timestamp.tsr" in readme
        _by_hand(downloaded, "checkpoint.note", tsa)

        # Offline, after more traffic, the head is newer: the older timestamped note, and
        # the proof that the head's tree extends it.
        log = manifest_log(offline)
        assert log["tree_size"] > head and log["timestamped_size"] == head
        assert STAMPED_FILES | {"timestamp.tsr"} <= {p.name for p in offline.iterdir()}
        said = _with_ca(offline, tsa)
        assert (
            f"timestamp  over timestamped.note's signed text (tree size {head}); the note's "
            f"tree extends it (consistency proof {head} to {log['tree_size']})"
        ) in said
        _by_hand(offline, "timestamped.note", tsa)

        # One flipped bit in the reply's signature, or in the consistency proof, fails.
        reply = (downloaded / "timestamp.tsr").read_bytes()
        (downloaded / "timestamp.tsr").write_bytes(flipped(reply, len(reply) - 20))
        assert "timestamp.tsr: openssl ts -verify does not accept it" in _refused_with_ca(
            downloaded, tsa
        )
        proof = json.loads((offline / "timestamp-consistency.json").read_bytes())
        proof["hashes"][0] = b64_flipped(proof["hashes"][0])
        (offline / "timestamp-consistency.json").write_text(json.dumps(proof))
        assert "timestamp-consistency.json: checkpoint.note's tree does not extend" in refused(
            offline
        )


def _by_hand(folder: Path, note: str, tsa: Tsa) -> None:
    """The README's commands, as pasted (the CA file is the reviewer's own)."""
    (folder / "TSA-CA.pem").write_bytes(tsa.ca.read_bytes())
    script = (
        f"awk '/^$/{{exit}} {{print}}' {note} > signed.txt\n"
        "openssl ts -verify -data signed.txt -in timestamp.tsr -CAfile TSA-CA.pem\n"
    )
    done = subprocess.run(
        ["sh", "-ec", script], cwd=folder, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "Verification: OK" in done.stdout, done
    for name in ("signed.txt", "TSA-CA.pem"):
        (folder / name).unlink()
