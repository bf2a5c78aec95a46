"""Evidence bundles carry the Merkle evidence: the checkpoint note of their head with the
witnesses' cosignatures, each entry's inclusion proof, and the verifier keys.

Bundles are made as a reviewer gets them (`sessionstate decisions bundle` on a stopped
service's data dir, and the reviewer page's download over real HTTP) and checked by the
shipped `verify.py` under the system's `python3 -I` in a clean directory
(tests/decisions/test_evidence_bundle.py's helpers), by Go's `logcheck` (sumdb/note and
transparency-dev/merkle), and against a real litewitness's cosignatures. One flipped bit
in the note, a proof, an entry line or a cosignature fails with a message naming it.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.cli import main
from service.policy.sidecar import OpaSidecar
from store.chain.checkpoints import KEY_FILE
from store.chain.keys import tree_key
from store.chain.log_note import LogSigner, latest_note
from store.chain.witness_store import with_cosignatures
from store.key_codec import TenantResourceLane
from store.secrets import SecretsHome, local_secret
from tests.decisions.test_evidence_bundle import (
    BUNDLE,
    UI,
    lines_of,
    run_verifier,
    sign_in,
    unpack,
)
from tests.http.test_http_decisions import auditor
from tests.http.test_http_log_proofs import TENANT, b64_flipped, flipped, logcheck, traffic
from tests.http.test_http_log_witnesses import (
    CHAIN_ORIGIN,
    ORIGIN,
    head_size,
    log_vkey,
    one_witness,
    until,
    witnessed_settings,
)
from tests.support.live import LiveService, live_service, service_settings

LOG_FILES = {"checkpoint.note", "proofs.ndjson", "log-key.vkey"}


def bundle_offline(data_dir: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`sessionstate decisions bundle --tenant` on the stopped service's data dir, unpacked."""
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    archive = out.with_suffix(".tar.gz")
    assert main(["decisions", "bundle", "--out", str(archive), "--tenant", TENANT]) == 0
    return unpack(archive, out)


def download(service: LiveService, out: Path) -> Path:
    """The reviewer page's bundle download, unpacked."""
    answer = sign_in(service, auditor(service)).get(service.url + BUNDLE, timeout=30)
    assert answer.status_code == 200, answer.text
    archive = out.with_suffix(".tar.gz")
    archive.write_bytes(answer.content)
    return unpack(archive, out)


def verified(folder: Path) -> str:
    done = run_verifier(folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("VERIFIED (README.md says what this proves and what it does not)\n")
    return done.stdout


def refused(folder: Path) -> str:
    done = run_verifier(folder)
    assert done.returncode == 1, done.stdout
    (line,) = done.stderr.splitlines()
    assert line.startswith("FAILED: ") and "VERIFIED" not in done.stdout
    return line


def manifest_log(folder: Path) -> dict[str, Any]:
    log: dict[str, Any] = json.loads((folder / "manifest.json").read_bytes())["log"]
    return log


def _note_root(folder: Path) -> None:
    data = (folder / "checkpoint.note").read_bytes()
    at = data.index(b"\n", data.index(b"\n") + 1) + 5  # a character of the root hash
    (folder / "checkpoint.note").write_bytes(flipped(data, at))


def signature_flipped(folder: Path, name: str, line: int) -> None:
    """One bit of the signature bytes of the note's signature line `line` flipped."""
    text, _, block = (folder / name).read_text().rpartition("\n\n")
    lines = block.split("\n")
    key, encoded = lines[line].rsplit(" ", 1)
    raw = base64.b64decode(encoded)
    lines[line] = key + " " + base64.b64encode(flipped(raw, len(raw) - 9)).decode()
    (folder / name).write_text(text + "\n\n" + "\n".join(lines))


def _note_signature(folder: Path) -> None:
    signature_flipped(folder, "checkpoint.note", 0)  # the log's own line comes first


def _proof_hash(folder: Path) -> None:
    lines = (folder / "proofs.ndjson").read_bytes().splitlines()
    proof = json.loads(lines[2])
    proof["hashes"][0] = b64_flipped(proof["hashes"][0])
    lines[2] = json.dumps(proof).encode()
    (folder / "proofs.ndjson").write_bytes(b"".join(line + b"\n" for line in lines))


def _entry_line(folder: Path) -> None:
    data = (folder / "entries.ndjson").read_bytes()
    (folder / "entries.ndjson").write_bytes(flipped(data, data.index(b'"recorded_at":"') + 20))


@pytest.fixture
def served_bundle(
    sidecar: OpaSidecar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """A bundle made offline after a service (no witnesses) served traffic, and the data dir."""
    settings = service_settings(tmp_path / "var", log_origin=ORIGIN)
    with live_service(sidecar, settings) as service:
        traffic(service)
    monkeypatch.setenv("SESSIONSTATE_LOG_ORIGIN", ORIGIN)
    return bundle_offline(settings.data_dir, tmp_path / "clean", monkeypatch), settings.data_dir


def test_a_bundle_carries_the_note_and_each_entrys_inclusion_proof(
    served_bundle: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data_dir = served_bundle
    assert {path.name for path in folder.iterdir()} >= LOG_FILES
    said = verified(folder)
    entries = lines_of(folder)
    head = json.loads((folder / "checkpoint.json").read_text())["seq"]
    log = manifest_log(folder)
    assert (log["origin"], log["tree_size"], log["witnesses"]) == (CHAIN_ORIGIN, head, [])
    assert (folder / "log-key.vkey").read_text() == log_vkey(data_dir) + "\n"
    assert f"note       {CHAIN_ORIGIN}, tree size {head} (the signed head's seq)" in said
    assert f"proofs     {len(entries)} inclusion proofs" in said
    assert "witnesses  none configured: the note is the log's own word" in said
    assert log["timestamped_size"] is None and not (folder / "timestamp.tsr").exists()
    assert "timestamp  none: no time-stamping authority timestamped a note" in said
    assert "files      8, each with the sha256 the signed manifest lists" in said
    # Go's sumdb/note and transparency-dev/merkle accept a proof taken from the bundle.
    proof = (folder / "proofs.ndjson").read_bytes().splitlines()[1]
    (tmp_path / "proof").write_bytes(proof)
    (tmp_path / "leaf").write_bytes(entries[1])
    base = ["--vkey", (folder / "log-key.vkey").read_text().strip(), "--origin", CHAIN_ORIGIN]
    command = ["inclusion", *base, "--checkpoint", folder / "checkpoint.note"]
    assert logcheck(*command, "--proof", tmp_path / "proof", "--leaf", tmp_path / "leaf")
    (tmp_path / "leaf").write_bytes(flipped(entries[1], 9))
    assert not logcheck(*command, "--proof", tmp_path / "proof", "--leaf", tmp_path / "leaf")


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        (_note_root, "checkpoint.note: the signature does not verify"),
        (_note_signature, "checkpoint.note: the signature does not verify"),
        (_proof_hash, "seq 3: its inclusion proof does not verify against the note's root"),
        (_entry_line, "seq 1: its content does not hash to its hash"),
    ],
    ids=["note-root", "note-signature", "proof-hash", "entry-line"],
)
def test_one_flipped_bit_fails(
    served_bundle: tuple[Path, Path], tamper: Callable[[Path], None], said: str
) -> None:
    folder, _ = served_bundle
    tamper(folder)
    assert said in refused(folder)


def test_a_chain_without_a_tree_gets_a_bundle_that_says_why_there_are_no_proofs(
    sidecar: OpaSidecar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = service_settings(tmp_path / "var")
    with live_service(sidecar, settings) as service:
        traffic(service, writes=1)
        lanes = service.context.lanes
        with lanes.batch(sync=True) as batch:  # a chain written before trees
            for key, _ in lanes.scan(TenantResourceLane.MERKLE_NODE, TENANT):
                batch.delete(key)
            batch.delete(tree_key(TENANT))
    folder = bundle_offline(settings.data_dir, tmp_path / "clean", monkeypatch)
    assert not LOG_FILES & {path.name for path in folder.iterdir()}
    assert manifest_log(folder) == {"absent": "decision_log_tree_unavailable"}
    said = verified(folder)
    assert "proofs     absent: decision_log_tree_unavailable" in said
    assert "`decision_log_tree_unavailable`" in (folder / "README.md").read_text()


def _cosigned_at_head(service: LiveService) -> int | None:
    """The head's size once the witness's cosignature of its note is kept (read from the
    store: a request would itself be a decision that grows the chain)."""
    lanes, size = service.context.lanes, head_size(service)
    log = LogSigner.of(SecretsHome.local(service.context.settings.data_dir), ORIGIN)
    note = latest_note(lanes, log, TENANT)
    if note is None or note.head.size != size:
        return None
    keys = [witness.vkey for witness in service.context.witnesses.witnesses]
    return size if with_cosignatures(lanes, TENANT, note, keys).cosigners else None


def test_with_a_witness_the_bundle_carries_its_cosignature_and_the_quorum_is_met(
    sidecar: OpaSidecar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with one_witness(tmp_path) as (witness, data_dir):
        settings = witnessed_settings(data_dir, [witness])
        with live_service(sidecar, settings) as service:
            traffic(service)
            size = until(lambda: _cosigned_at_head(service), "the head's note, cosigned")
            # The page's download is a decision too: its head is past the cosigned one.
            page = sign_in(service, auditor(service)).get(service.url + UI, timeout=30)
            shown = re.search(r'<strong class="note-size">(\d+)</strong>', page.text)
            assert shown is not None and int(shown.group(1)) >= size
            assert f"Witnesses {witness.name} cosigned tree size " in page.text
            assert '<strong class="quorum">met</strong>' in page.text
            assert 'href="/v1/decisions/checkpoint"' in page.text
            assert 'href="/v1/decisions/log-key"' in page.text
            downloaded = download(service, tmp_path / "downloaded")
            final = until(lambda: _cosigned_at_head(service), "the last head's note, cosigned")
        monkeypatch.setenv("SESSIONSTATE_LOG_ORIGIN", ORIGIN)
        monkeypatch.setenv("SESSIONSTATE_LOG_WITNESSES", json.dumps([{"vkey": witness.vkey, "url": witness.url}]))  # fmt: skip
        offline = bundle_offline(data_dir, tmp_path / "offline", monkeypatch)

    # Offline, the head's own note carries the cosignature.
    log = manifest_log(offline)
    assert (log["tree_size"], log["witnessed_size"]) == (final, final)
    assert (log["witnesses"], log["quorum"]) == ([witness.vkey], 1)
    said = verified(offline)
    assert f"witnesses  1 of 1 cosigned tree size {final} ({witness.name}; quorum 1: met)" in said

    # Downloaded, the head is newer: the witnessed note and the consistency proof to it.
    log = manifest_log(downloaded)
    assert log["tree_size"] > log["witnessed_size"] >= size
    assert {"witnessed.note", "consistency.json"} <= {p.name for p in downloaded.iterdir()}
    said = verified(downloaded)
    assert (
        f"witnesses  1 of 1 cosigned tree size {log['witnessed_size']} ({witness.name}; quorum "
        f"1: met); the note's tree extends it (consistency proof {log['witnessed_size']} to "
        f"{log['tree_size']} verified)"
    ) in said

    # One flipped bit in the cosignature (the last line's end) fails.
    signature_flipped(offline, "checkpoint.note", 1)
    assert f"checkpoint.note cosigned by {witness.name}: the signature does not verify" in (
        refused(offline)
    )
    proof = json.loads((downloaded / "consistency.json").read_bytes())
    proof["hashes"][-1] = b64_flipped(proof["hashes"][-1])
    (downloaded / "consistency.json").write_text(json.dumps(proof))
    assert "consistency.json: checkpoint.note's tree does not extend" in refused(downloaded)


def test_the_page_says_when_no_witness_is_configured(service: LiveService) -> None:
    traffic(service, writes=1)
    assert service.call("GET", "/v1/decisions/checkpoint", auditor(service)).status_code == 200
    page = sign_in(service, auditor(service)).get(service.url + UI, timeout=30)
    assert "latest checkpoint note of tree size" in page.text
    assert "No witnesses are configured: the note is the log's own word." in page.text


def test_a_bundle_made_before_bundles_carried_proofs_still_verifies_and_says_so(
    served_bundle: tuple[Path, Path],
) -> None:
    folder, data_dir = served_bundle
    manifest = json.loads((folder / "manifest.json").read_bytes())
    del manifest["log"]
    manifest["kind"] = "sessionstate.evidence_bundle.v2"  # as releases before it signed them
    for name in LOG_FILES:
        del manifest["sha256"][name]
        (folder / name).unlink()
    key = Ed25519PrivateKey.from_private_bytes(local_secret(data_dir, KEY_FILE, nbytes=32))
    (folder / "manifest.json").write_bytes(rfc8785.dumps(manifest))
    (folder / "manifest.sig").write_bytes(key.sign(rfc8785.dumps(manifest)))
    said = verified(folder)
    assert "proofs     none: this bundle was made before bundles carried Merkle proofs" in said
    assert "files      5, each with the sha256 the signed manifest lists" in said
