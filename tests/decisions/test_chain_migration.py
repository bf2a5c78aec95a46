"""`sessionstate db upgrade` on a data dir written with the one global chain of older versions.

The data dir is built here with the old key layout, written directly: every
tenant's entries on one chain (`TRACE_EVIDENCE` with no tenant, keyed by
seq), the old indexes (by tenant and seq; by decision id, with no tenant),
and a checkpoint signed then (it names no tenant). The service refuses it
until the upgrade; after it, every chain verifies, the old checkpoint still
verifies, and the service starts and serves each tenant its own chain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from service.decisions.log import DecisionOutcome
from service.policy.sidecar import OpaSidecar
from store.backends.contract import Lanes
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_digest, canonical_json
from store.chain.checkpoints import CheckpointSigner
from store.chain.evidence import EvidenceChain
from store.chain.head import GENESIS, ChainHead, format_timestamp
from store.chain.keys import chain_names
from store.key_codec import LaneKey, TenantResourceLane
from store.secrets import SecretsHome
from tests.support.factories import decision_entry_body
from tests.support.live import DIGEST_KEY, JWT_SECRET, live_service, service_settings
from tests.support.served import ROOT

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
TENANTS = ["tenant-a", "tenant-b", "tenant-a", "tenant-a", "tenant-b", "tenant-c", "tenant-a"]


def _seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def write_legacy_data_dir(data_dir: Path, lanes: Lanes | None = None) -> list[dict[str, Any]]:
    """The old layout, key by key (in the data dir's LevelDB unless `lanes` is given), and a
    checkpoint of its head as it was signed then."""
    own = lanes is None
    lanes = lanes or LevelDBLaneStore(data_dir / "leveldb")
    head = GENESIS
    entries: list[dict[str, Any]] = []
    try:
        for n, tenant in enumerate(TENANTS, start=1):
            body = decision_entry_body(f"legacy-{n}", tenant, n=n)
            outcome = DecisionOutcome(status=200, applied=False, approval_id=None)
            entry = body.sealable(outcome, format_timestamp(T0 + timedelta(minutes=n)))
            entry |= {"seq": n, "prev_hash": head.hash}
            entry["hash"] = canonical_digest(entry)
            with lanes.batch(sync=True) as batch:
                batch.put(
                    LaneKey(TenantResourceLane.TRACE_EVIDENCE, name=_seq(n)), canonical_json(entry)
                )
                batch.put(LaneKey(TenantResourceLane.TRACE_INDEX, tenant, name=_seq(n)), b"")
                batch.put(
                    LaneKey(TenantResourceLane.TRACE_INDEX, name=f"id:legacy-{n}".encode()), _seq(n)
                )
            head = ChainHead(seq=n, hash=entry["hash"])
            entries.append(entry)
    finally:
        if own:
            lanes.close()
    old = CheckpointSigner.of(SecretsHome.local(data_dir)).sign(head, T0 + timedelta(hours=1), None)
    (data_dir.parent / "old-checkpoint.json").write_text(old.model_dump_json())
    return entries


def _cli(
    data_dir: Path, opa_bin: str, *args: str, store: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "SESSIONSTATE_DATA_DIR": str(data_dir),
        "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
        "SESSIONSTATE_OPA_BIN": opa_bin,
        "SESSIONSTATE_PORT": "0",
    } | ({"SESSIONSTATE_STORE": store} if store else {})
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_refuses_the_global_chain_and_says_how(tmp_path: Path, opa_bin: str) -> None:
    data_dir = tmp_path / "var"
    write_legacy_data_dir(data_dir)
    refused = _cli(data_dir, opa_bin, "serve")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "sessionstate: the decision log is the single global chain of an older sessionstate; "
        "stop the service and run `sessionstate db upgrade` to move it onto per-tenant chains"
    ]


def test_db_upgrade_moves_the_global_chain_onto_tenant_chains(
    tmp_path: Path,
    opa_bin: str,
    sidecar: OpaSidecar,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data_dir = tmp_path / "var"
    old = write_legacy_data_dir(data_dir)

    done = _cli(data_dir, opa_bin, "db", "upgrade")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["store"] == "leveldb" and printed["changed"] is True
    migrated = printed["chains_migrated"]
    assert migrated["entries"] == len(TENANTS)
    assert migrated["old_head"] == {"seq": len(TENANTS), "hash": old[-1]["hash"]}
    assert {name: head["seq"] for name, head in migrated["chains"].items()} == {
        "tenant-a": 4,
        "tenant-b": 2,
        "tenant-c": 1,
    }
    again = _cli(data_dir, opa_bin, "db", "upgrade")
    assert again.returncode == 0 and json.loads(again.stdout)["chains_migrated"] is None

    # Every chain verifies, offline; the old order and links are kept on each entry.
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["decisions", "verify", "--all-tenants"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert every["ok"] is True and every["entries"] == len(TENANTS)
    assert sorted(every["chains"]) == ["tenant-a", "tenant-b", "tenant-c"]
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    try:
        assert chain_names(lanes) == ["tenant-a", "tenant-b", "tenant-c"]
        moved = [
            entry for name in chain_names(lanes) for entry in EvidenceChain(lanes, name).scan()
        ]
        by_old_seq = sorted(moved, key=lambda entry: entry["legacy"]["seq"])
        assert [(e["legacy"]["seq"], e["legacy"]["hash"]) for e in by_old_seq] == [
            (e["seq"], e["hash"]) for e in old
        ]
        assert not any(True for _ in lanes.scan(TenantResourceLane.TRACE_EVIDENCE, ""))
    finally:
        lanes.close()
    # A checkpoint signed before the upgrade still verifies, against the rebuilt old entries.
    checkpoint = tmp_path / "old-checkpoint.json"
    assert main(["decisions", "verify", "--checkpoint", str(checkpoint)]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True

    # The service starts on it, and each tenant's auditor verifies its own chain.
    with live_service(sidecar, service_settings(data_dir)) as service:
        for tenant, count in (("tenant-a", 4), ("tenant-b", 2)):
            token = service.token("auditor", sub="au", tenant=tenant, workspace=None, session=None)
            verify = service.call("GET", "/v1/decisions/verify", token).json()
            assert verify["ok"] is True and verify["entries"] >= count
            assert verify["checkpoint"]["tenant_id"] == tenant
            listed = service.call("GET", "/v1/decisions/legacy-1", token)
            assert listed.status_code == (200 if tenant == "tenant-a" else 404)


@pytest.mark.slow
def test_db_upgrade_moves_a_global_chain_on_postgresql(
    tmp_path: Path, opa_bin: str, postgres_conninfo: str
) -> None:
    """A database a preview wrote with the global chain: refused, then moved, then served."""
    from store.backends.postgres import PostgresLaneStore

    data_dir = tmp_path / "var"
    data_dir.mkdir()
    written = PostgresLaneStore(postgres_conninfo)
    try:
        old = write_legacy_data_dir(data_dir, written)
    finally:
        written.close()
    refused = _cli(data_dir, opa_bin, "serve", store=postgres_conninfo)
    assert refused.returncode == 2
    assert "run `sessionstate db upgrade`" in refused.stderr

    done = _cli(data_dir, opa_bin, "db", "upgrade", store=postgres_conninfo)
    assert done.returncode == 0, done.stderr
    migrated = json.loads(done.stdout)["chains_migrated"]
    assert migrated["entries"] == len(TENANTS)
    assert migrated["old_head"]["hash"] == old[-1]["hash"]
    lanes = PostgresLaneStore(postgres_conninfo)
    try:
        assert chain_names(lanes) == ["tenant-a", "tenant-b", "tenant-c"]
        for name, count in (("tenant-a", 4), ("tenant-b", 2), ("tenant-c", 1)):
            verified = EvidenceChain(lanes, name).verify()
            assert verified.ok and verified.entries == count
        assert not any(True for _ in lanes.scan(TenantResourceLane.TRACE_EVIDENCE, ""))
    finally:
        lanes.close()
    again = _cli(data_dir, opa_bin, "db", "upgrade", store=postgres_conninfo)
    assert again.returncode == 0 and json.loads(again.stdout)["chains_migrated"] is None
    # An operator verifies every chain of the database, with the command line.
    every = _cli(data_dir, opa_bin, "decisions", "verify", "--all-tenants", store=postgres_conninfo)
    assert every.returncode == 0, every.stderr
    verified = json.loads(every.stdout)
    assert verified["ok"] is True and verified["entries"] == len(TENANTS)
    assert sorted(verified["chains"]) == ["tenant-a", "tenant-b", "tenant-c"]
