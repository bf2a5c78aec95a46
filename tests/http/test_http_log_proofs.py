"""The decision log's Merkle proofs end to end: checkpoint notes, the verifier key, inclusion
and consistency proofs over real HTTP, each checked by the real Go `logcheck` (Go's sumdb/note,
formats/log and transparency-dev/merkle) and by the standard-library verifiers."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from service.decisions.log import prune_log
from service.policy.sidecar import OpaSidecar
from store.canonical import canonical_json
from store.chain.checkpoints import CheckpointSigner
from store.chain.keys import entry_key, node_key, tree_key
from store.chain.note import VerifierKey, open_note
from store.chain.rfc9162 import verify_consistency, verify_inclusion
from store.chain.tlog_checkpoint import TreeHead
from store.chain.tree_frontier import edge
from store.key_codec import TenantResourceLane
from store.secrets import SecretsHome
from tests.support.factories import state_input
from tests.support.go_tools import run_go_tool
from tests.support.live import LiveService, live_service, service_settings

TENANT = "tenant-a"


def auditor(service: LiveService, tenant: str = TENANT) -> str:
    return service.token("auditor", sub="au-1", tenant=tenant, workspace=None, session=None)


def traffic(service: LiveService, writes: int = 3) -> None:
    """Decisions on the tenant's chain: a grant, writes and reads."""
    service.approve()
    for _ in range(writes):
        answer = service.call(
            "PUT", service.session_path() + "/state", service.token(), json=state_input()
        )
        assert answer.status_code in (200, 201), answer.text
        assert service.call("GET", service.session_path() + "/state", service.token()).ok


def get(service: LiveService, path: str, **params: Any) -> Any:
    answer = service.http.get(
        service.url + path,
        params=params,
        headers={"Authorization": f"Bearer {auditor(service)}"},
        timeout=30,
    )
    return answer


def checkpoint(service: LiveService) -> bytes:
    answer = get(service, "/v1/decisions/checkpoint")
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert answer.headers["Sessionstate-Decision-Id"]
    return bytes(answer.content)


def log_key(service: LiveService) -> str:
    answer = get(service, "/v1/decisions/log-key")
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"] == "text/plain; charset=utf-8"
    return str(answer.text).strip()


def opened(note: bytes, vkey: str) -> TreeHead:
    return TreeHead.parse(open_note(note, VerifierKey.parse(vkey)).text)


def origin_of(vkey: str) -> str:
    return VerifierKey.parse(vkey).name + "/" + TENANT


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def b64_flipped(encoded: str) -> str:
    """A base64 hash with one bit of its bytes flipped."""
    return base64.b64encode(flipped(base64.b64decode(encoded), 7)).decode()


def logcheck(*args: str | Path) -> bool:
    done = run_go_tool("logcheck", *args)
    if done.returncode == 0:
        assert done.stdout.startswith("ok "), done.stdout
    return done.returncode == 0


def first_write(service: LiveService) -> dict[str, Any]:
    """The tenant's first applied write, as listed (as stored)."""
    answer = get(service, "/v1/decisions", action="write")
    assert answer.status_code == 200, answer.text
    entry: dict[str, Any] = answer.json()["decisions"][0]
    return entry


def check_inclusion(
    service: LiveService, tmp: Path, vkey: str, note: bytes, entry: dict[str, Any]
) -> dict[str, Any]:
    """The entry's inclusion proof in the note's tree, checked by logcheck and the stdlib."""
    head = opened(note, vkey)
    answer = get(
        service,
        f"/v1/decisions/{entry['decision']['decision_id']}/inclusion",
        tree_size=str(head.size),
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["Sessionstate-Decision-Id"]
    proof: dict[str, Any] = answer.json()
    assert set(proof) == {"leaf_index", "tree_size", "leaf_hash", "hashes"}
    assert (proof["leaf_index"], proof["tree_size"]) == (entry["seq"] - 1, head.size)
    leaf = canonical_json(entry)  # the listing's entry, as stored: its RFC 8785 bytes
    assert leaf == service.context.lanes.get(entry_key(entry["seq"], TENANT))
    files = {"note": note, "proof": json.dumps(proof).encode(), "leaf": leaf}
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    base = ["--vkey", vkey, "--origin", origin_of(vkey), "--checkpoint", tmp / "note"]
    command = ["inclusion", *base, "--proof", tmp / "proof", "--leaf", tmp / "leaf"]
    assert logcheck(*command)
    hashes = [base64.b64decode(h) for h in proof["hashes"]]
    leaf_hash = base64.b64decode(proof["leaf_hash"])
    assert verify_inclusion(proof["leaf_index"], head.size, leaf_hash, hashes, head.root_hash)
    bad_proof = dict(proof, leaf_hash=b64_flipped(proof["leaf_hash"]))
    if proof["hashes"]:
        bad_proof = dict(proof, hashes=[b64_flipped(proof["hashes"][0]), *proof["hashes"][1:]])
    broken = {
        "note": flipped(note, len(note) - 10),  # a bit of the signature
        "proof": json.dumps(bad_proof).encode(),
        "leaf": flipped(leaf, len(leaf) // 2),
    }
    for name, data in broken.items():  # one flipped bit anywhere: refused
        (tmp / name).write_bytes(data)
        assert not logcheck(*command), name
        (tmp / name).write_bytes(files[name])
    return proof


def check_consistency(service: LiveService, tmp: Path, vkey: str, old: bytes, new: bytes) -> None:
    first, second = opened(old, vkey), opened(new, vkey)
    answer = get(
        service, "/v1/decisions/consistency", first=str(first.size), second=str(second.size)
    )
    assert answer.status_code == 200, answer.text
    proof = answer.json()
    assert set(proof) == {"first", "second", "hashes"}
    (tmp / "old").write_bytes(old)
    (tmp / "new").write_bytes(new)
    (tmp / "proof").write_text(json.dumps(proof))
    base = ["--vkey", vkey, "--origin", origin_of(vkey)]
    command = ["consistency", *base, "--old", tmp / "old", "--new", tmp / "new"]
    assert logcheck(*command, "--proof", tmp / "proof")
    hashes = [base64.b64decode(h) for h in proof["hashes"]]
    assert verify_consistency(first.size, second.size, first.root_hash, second.root_hash, hashes)
    if hashes:
        bad = dict(proof, hashes=[b64_flipped(proof["hashes"][0]), *proof["hashes"][1:]])
        (tmp / "proof").write_text(json.dumps(bad))
        assert not logcheck(*command, "--proof", tmp / "proof")
    (tmp / "old").write_bytes(flipped(old, len(old) - 10))
    (tmp / "proof").write_text(json.dumps(proof))
    assert not logcheck(*command, "--proof", tmp / "proof")


def test_notes_and_proofs_check_with_go_tools_nobody_here_wrote(
    service: LiveService, tmp_path: Path
) -> None:
    traffic(service)
    vkey = log_key(service)
    key = CheckpointSigner.of(SecretsHome.local(service.settings.data_dir))
    assert VerifierKey.parse(vkey).name == "sessionstate.local/" + key.key_id[len("ed25519:") :]
    note = checkpoint(service)
    (tmp_path / "note").write_bytes(note)
    base = ["--vkey", vkey, "--origin", origin_of(vkey)]
    assert logcheck("checkpoint", *base, tmp_path / "note")
    (tmp_path / "note").write_bytes(flipped(note, note.index(b"\n") + 1))
    assert not logcheck("checkpoint", *base, tmp_path / "note")

    entry = first_write(service)
    check_inclusion(service, tmp_path, vkey, note, entry)
    traffic(service, writes=2)  # more traffic: a grown tree that extends the old one
    later = checkpoint(service)
    assert opened(later, vkey).size > opened(note, vkey).size
    check_consistency(service, tmp_path, vkey, note, later)
    check_inclusion(service, tmp_path, vkey, later, entry)
    # The log-key route and the note's signature line name the same key.
    assert (
        open_note(later, VerifierKey.parse(vkey)).signatures[0].name == VerifierKey.parse(vkey).name
    )


def test_proof_sizes_outside_the_notes_are_refused_without_echo(service: LiveService) -> None:
    traffic(service, writes=1)
    entry = first_write(service)
    size = opened(checkpoint(service), log_key(service)).size
    inclusion = f"/v1/decisions/{entry['decision']['decision_id']}/inclusion"
    for params, reason in [
        ({"tree_size": "0"}, "validation_failed"),
        ({"tree_size": "x"}, "validation_failed"),
        ({"tree_size": "987654321"}, "proof_out_of_range"),
        ({"tree_size": str(entry["seq"] - 1)}, "proof_out_of_range"),
    ]:
        answer = get(service, inclusion, **params)
        assert (answer.status_code, answer.json()["reason"]) == (422, reason), params
        assert "987654321" not in answer.text
    for params, reason in [
        ({"first": "2", "second": "1"}, "proof_out_of_range"),
        ({"first": "1", "second": "987654321"}, "proof_out_of_range"),
        ({"first": "0", "second": str(size)}, "validation_failed"),
        ({"second": str(size)}, "validation_failed"),
    ]:
        answer = get(service, "/v1/decisions/consistency", **params)
        assert (answer.status_code, answer.json()["reason"]) == (422, reason), params
        assert "987654321" not in answer.text
    other = service.http.get(
        service.url + "/v1/decisions/checkpoint",
        params={"tenant_id": TENANT},
        headers={"Authorization": f"Bearer {auditor(service, 'tenant-b')}"},
        timeout=10,
    )
    assert other.status_code == 403
    unknown = get(service, "/v1/decisions/no-such-decision/inclusion")
    assert (unknown.status_code, unknown.json()["reason"]) == (404, "decision_not_found")


def edit_entry(service: LiveService, seq: int) -> None:
    """Edit entry seq of the tenant's chain in the store, as whoever holds it could (its
    hash no longer matches: the chain breaks there)."""
    lanes = service.context.lanes
    key = entry_key(seq, TENANT)
    stored = lanes.get(key)
    assert stored is not None
    with lanes.batch(sync=True) as batch:
        batch.put(key, stored.replace(b'"status":', b'"status":1'))


def test_a_broken_chain_gets_no_note(service: LiveService) -> None:
    traffic(service, writes=1)
    size = opened(checkpoint(service), log_key(service)).size
    traffic(service, writes=1)  # entries after the note, one of them then edited
    edit_entry(service, size + 2)
    answer = get(service, "/v1/decisions/checkpoint")
    assert (answer.status_code, answer.json()["reason"]) == (409, "chain_unverified")
    assert b"\xe2\x80\x94" not in answer.content  # no signature line of a note


def drop_tree(service: LiveService) -> None:
    """What a chain written before trees looks like: no nodes, no tree key."""
    lanes = service.context.lanes
    with lanes.batch(sync=True) as batch:
        for key, _ in lanes.scan(TenantResourceLane.MERKLE_NODE, TENANT):
            batch.delete(key)
        batch.delete(tree_key(TENANT))


def test_db_upgrade_builds_the_tree_of_a_chain_written_without_one(
    sidecar: OpaSidecar,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = service_settings(tmp_path / "var")
    with live_service(sidecar, settings) as service:
        traffic(service)
        drop_tree(service)
        traffic(service, writes=1)  # appended without a tree: no nodes
        answer = get(service, "/v1/decisions/checkpoint")
        assert (answer.status_code, answer.json()["reason"]) == (
            409,
            "decision_log_tree_unavailable",
        )
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(settings.data_dir))
    assert main(["db", "upgrade"]) == 0
    assert json.loads(capsys.readouterr().out)["trees_built"] == [TENANT]
    assert main(["db", "upgrade"]) == 0  # again: nothing to do
    done = json.loads(capsys.readouterr().out)
    assert (done["trees_built"], done["trees_unbuildable"]) == (None, [])
    with live_service(sidecar, settings) as service:
        vkey = log_key(service)
        note = checkpoint(service)
        entry = first_write(service)
        proof = check_inclusion(service, tmp_path, vkey, note, entry)
    # The offline twins answer what the routes answer.
    size = str(proof["tree_size"])
    assert main(["decisions", "prove", entry["decision"]["decision_id"], "--tree-size", size]) == 0
    assert json.loads(capsys.readouterr().out) == proof
    assert main(["decisions", "log-key"]) == 0
    assert capsys.readouterr().out.strip() == vkey
    assert main(["decisions", "consistency", "--first", "1", "--second", size]) == 0
    assert json.loads(capsys.readouterr().out)["second"] == proof["tree_size"]


def test_a_damaged_node_drops_the_tree_at_the_next_note_and_db_upgrade_rebuilds_it(
    sidecar: OpaSidecar,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The journal appends on the tree's frontier it kept, so it never reads the node damaged
    under it; the next note recomputes the tree, finds it, drops the tree, and signs
    nothing; `db upgrade` then builds the tree again from the entries."""
    caplog.set_level(logging.ERROR, logger="sessionstate.decisions")
    settings = service_settings(tmp_path / "var")
    with live_service(sidecar, settings) as service:
        traffic(service)
        signed = opened(checkpoint(service), log_key(service)).size
        lanes = service.context.lanes
        with lanes.batch(sync=True) as batch:  # one node of the signed tree's edge, changed
            batch.put(node_key(TENANT, edge(signed)[-1]), bytes(32))
        traffic(service, writes=2)  # appended on the kept frontier: nothing refused
        answer = get(service, "/v1/decisions/checkpoint")
        assert (answer.status_code, answer.json()["reason"]) == (
            409,
            "decision_log_tree_unavailable",
        )
        assert lanes.get(tree_key(TENANT)) is None
        assert "decision_log_tree_dropped" in [r.getMessage() for r in caplog.records]
        traffic(service, writes=1)  # appended without a tree, as before trees
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(settings.data_dir))
    assert main(["db", "upgrade"]) == 0
    assert json.loads(capsys.readouterr().out)["trees_built"] == [TENANT]
    with live_service(sidecar, settings) as service:
        vkey = log_key(service)
        note = checkpoint(service)
        assert opened(note, vkey).size > signed
        check_inclusion(service, tmp_path, vkey, note, first_write(service))


def test_a_chain_pruned_before_its_tree_is_unbuildable(
    sidecar: OpaSidecar,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = service_settings(tmp_path / "var")
    with live_service(sidecar, settings) as service:
        traffic(service, writes=1)
        drop_tree(service)
        now = datetime.now(UTC)
        signer = CheckpointSigner.of(SecretsHome.local(settings.data_dir))
        assert prune_log(service.context.lanes, now + timedelta(hours=1), signer, now) > 0
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(settings.data_dir))
    assert main(["db", "upgrade"]) == 0
    assert json.loads(capsys.readouterr().out)["trees_unbuildable"] == [TENANT]
    with live_service(sidecar, settings) as service:
        answer = get(service, "/v1/decisions/consistency", first="1", second="1")
        assert (answer.status_code, answer.json()["reason"]) == (
            409,
            "decision_log_tree_unavailable",
        )
        assert get(service, "/v1/decisions/verify").json()["ok"] is True


def test_retention_keeps_the_proofs_of_kept_entries(service: LiveService, tmp_path: Path) -> None:
    traffic(service)
    vkey = log_key(service)
    before = checkpoint(service)
    now = datetime.now(UTC)
    signer = CheckpointSigner.of(SecretsHome.local(service.settings.data_dir))
    pruned = prune_log(service.context.lanes, now + timedelta(hours=1), signer, now)
    assert pruned > 0
    nodes = list(service.context.lanes.scan(TenantResourceLane.MERKLE_NODE, TENANT))
    assert len(nodes) < pruned  # the pruned prefix's nodes went, all but its frontier
    traffic(service, writes=2)
    after = checkpoint(service)
    traffic(service, writes=1)
    later = checkpoint(service)
    check_consistency(service, tmp_path, vkey, after, later)
    entry = first_write(service)  # the first write still kept: after the prune
    assert entry["seq"] > pruned
    check_inclusion(service, tmp_path, vkey, later, entry)
    old = opened(before, vkey).size
    answer = get(
        service, "/v1/decisions/consistency", first="1", second=str(opened(later, vkey).size)
    )
    assert (answer.status_code, answer.json()["reason"]) == (410, "proof_pruned")
    if old >= pruned:  # a note of a size at the first kept leaf or above stays provable
        check_consistency(service, tmp_path, vkey, before, later)


@pytest.fixture
def on_postgres(
    sidecar: OpaSidecar, tmp_path: Path, postgres_conninfo: str
) -> Iterator[LiveService]:
    settings = service_settings(
        tmp_path / "var", store=postgres_conninfo, log_origin="log.example/x"
    )
    with live_service(sidecar, settings) as live:
        yield live


def test_proofs_on_postgresql(on_postgres: LiveService, tmp_path: Path) -> None:
    service = on_postgres
    traffic(service)
    vkey = log_key(service)
    assert VerifierKey.parse(vkey).name == "log.example/x"
    note = checkpoint(service)
    assert note.startswith(b"log.example/x/tenant-a\n")
    entry = first_write(service)
    check_inclusion(service, tmp_path, vkey, note, entry)
    traffic(service, writes=1)
    check_consistency(service, tmp_path, vkey, note, checkpoint(service))
