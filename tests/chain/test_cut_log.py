"""A decision log cut after a verify signed its head, end to end: restarted, the service signs
nothing for that tenant (no bundle, no checkpoint, offline or over HTTP) and takes none of its
decisions (503, nothing stored) while other tenants are served and /readyz says so; after
`sessionstate decisions record-loss` the chain takes entries again and verifies, the loss
reported."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import requests

from service.cli import main
from service.policy.sidecar import OpaSidecar
from store.backends.leveldb import LevelDBLaneStore
from store.chain.evidence import EvidenceChain
from store.chain.full_walk import full_walk_key
from store.chain.keys import entry_key
from tests.decisions.test_evidence_bundle import BUNDLE, run_verifier, sign_in, unpack
from tests.http.test_http_decisions import auditor
from tests.support.factories import state_input
from tests.support.live import LiveService, live_service, service_settings

VERIFY = "/v1/decisions/verify"
BEHIND = "decision_log_behind_signed_head"


def approve(service: LiveService, tenant: str) -> None:
    path = f"/v1/tenants/{tenant}/workspaces/ws-1/approvals"
    body = {"ttl_seconds": 600, "reason": "tests"}
    assert service.call("POST", path, service.operator(tenant), json=body).status_code == 201


def write(service: LiveService, tenant: str, session: str = "chat-1") -> requests.Response:
    token = service.token(tenant=tenant, session=session)
    path = service.session_path(t=tenant, s=session) + "/state"
    return service.call("PUT", path, token, json=state_input())


def read(service: LiveService, tenant: str, session: str = "chat-1") -> requests.Response:
    token = service.token(tenant=tenant, session=session)
    return service.call("GET", service.session_path(t=tenant, s=session) + "/state", token)


def verify(service: LiveService) -> requests.Response:
    return service.call("GET", VERIFY, auditor(service))


def refused_as_behind(answer: requests.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert answer.json()["reason"] == BEHIND
    assert answer.headers["Retry-After"] == "60"  # not an outage that passes by itself


def cut_tail(data_dir: Path, tenant: str, from_seq: int) -> int:
    """Delete the tenant's entries from from_seq to its head, with the service stopped; the
    seq the chain then ends at."""
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    try:
        chain = EvidenceChain(lanes, tenant)
        for seq in range(from_seq, chain.head().seq + 1):
            lanes.delete(entry_key(seq, tenant))
        return chain.head().seq
    finally:
        lanes.close()


def offline(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["decisions", *args])
    return code, capsys.readouterr().out


def test_a_cut_log_is_neither_signed_nor_written_over_until_its_loss_is_recorded(
    sidecar: OpaSidecar,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data_dir = tmp_path / "var"
    settings = service_settings(data_dir)
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    with live_service(sidecar, settings) as service:
        approve(service, "tenant-a")
        approve(service, "tenant-b")
        for n in range(4):
            assert write(service, "tenant-a", f"chat-{n}").status_code == 201
        assert write(service, "tenant-b").status_code == 201
        signed = verify(service).json()["checkpoint"]  # remembered for tenant-a's chain
        assert signed is not None
    signed_seq = signed["seq"]
    ends_at = cut_tail(data_dir, "tenant-a", signed_seq - 1)
    assert ends_at == signed_seq - 2

    with caplog.at_level(logging.ERROR), live_service(sidecar, settings) as service:
        # Found as the service starts, before any request of that tenant.
        assert service.call("GET", "/readyz").json()["chains_behind_signed_head"] == 1
        refused_as_behind(write(service, "tenant-a", "chat-new"))
        refused_as_behind(read(service, "tenant-a"))
        walked_before = service.context.lanes.get(full_walk_key("tenant-a"))
        refused_as_behind(verify(service))  # its decision goes on that chain: no checkpoint
        # Refused before any walk: nothing of it kept, not even a record of a whole walk.
        assert service.context.lanes.get(full_walk_key("tenant-a")) == walked_before
        download = sign_in(service, auditor(service)).get(service.url + BUNDLE, timeout=10)
        # Refused as chain_unverified (409), then as a decision its chain cannot take.
        assert (download.status_code, BEHIND in download.text) == (503, True)
        assert "Content-Disposition" not in download.headers
        assert EvidenceChain(service.context.lanes, "tenant-a").head().seq == ends_at
        # Other tenants are served.
        assert write(service, "tenant-b", "chat-2").status_code == 201
        assert read(service, "tenant-b").status_code == 200
        ready = service.call("GET", "/readyz")
        assert ready.status_code == 200
        assert BEHIND in ready.json()["warnings"]
        assert ready.json()["chains_behind_signed_head"] == 1
        assert "tenant-a" not in ready.text
    said = [record for record in caplog.records if record.getMessage() == BEHIND]
    assert [getattr(record, "chain", None) for record in said] == ["tenant-a"]  # once

    # Offline, the service stopped: no checkpoint, no bundle of that chain; another's signs.
    assert offline(capsys, "checkpoint", "--tenant", "tenant-a")[0] == 1
    out = tmp_path / "a.tar.gz"
    assert offline(capsys, "bundle", "--out", str(out), "--tenant", "tenant-a")[0] == 1
    assert not out.exists()
    assert offline(capsys, "checkpoint", "--tenant", "tenant-b")[0] == 0

    code, printed = offline(capsys, "record-loss", "--tenant", "tenant-a")
    assert code == 0
    loss_entry = json.loads(printed)
    assert loss_entry["seq"] == signed_seq + 1  # no seq the signed head covered is re-used
    assert loss_entry["prev_hash"] == signed["head_hash"]
    loss = loss_entry["loss"]
    assert (loss["lost_from_seq"], loss["lost_to_seq"]) == (signed_seq - 1, signed_seq)
    assert loss["follows"]["seq"] == ends_at and loss["signed_head"] == signed
    assert offline(capsys, "record-loss", "--tenant", "tenant-a")[0] == 2  # nothing more lost
    assert offline(capsys, "verify", "--tenant", "tenant-a")[0] == 0

    with live_service(sidecar, settings) as service:
        assert write(service, "tenant-a", "chat-new").status_code == 201
        verified = verify(service).json()
        assert verified["ok"] is True and verified["checkpoint"] is not None
        assert verified["checkpoint"]["seq"] > signed_seq + 1
        recorded: list[dict[str, Any]] = verified["recorded_losses"]
        assert [(r["seq"], r["lost_from_seq"], r["lost_to_seq"]) for r in recorded] == [
            (signed_seq + 1, signed_seq - 1, signed_seq)
        ]
        assert BEHIND not in service.call("GET", "/readyz").json()["warnings"]
        download = sign_in(service, auditor(service)).get(service.url + BUNDLE, timeout=10)
        assert download.status_code == 200
        archive = tmp_path / "after.tar.gz"
        archive.write_bytes(download.content)
        checked = run_verifier(unpack(archive, tmp_path / "after"))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        # The verifier names the recorded loss; it counts as no unexplained gap.
        lost = f"loss       seqs {signed_seq - 1} to {signed_seq} are gone: the chain's own entry"
        assert lost in checked.stdout
        assert "; 0 gaps cross" in checked.stdout
