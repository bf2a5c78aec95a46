"""The retention anchor is signed: deleting the oldest entries and storing a matching anchor
without the checkpoint key fails verify, over HTTP and offline, with a problem of its own;
an older release's unsigned anchor fails until `db upgrade` signs it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from service.cli import main
from service.policy.sidecar import OpaSidecar
from store.backends.contract import Lanes
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_json
from store.chain.checkpoints import CheckpointSigner
from store.chain.entry import ChainCorrupt
from store.chain.evidence import EvidenceChain
from store.chain.head import ChainHead, format_timestamp
from store.chain.keys import anchor_key, entry_key
from store.secrets import SecretsHome
from tests.http.test_http_decisions import DECISIONS, auditor, exercise
from tests.support.live import LiveService, live_service, service_settings

OLD = datetime.now(UTC) - timedelta(days=30)
TENANT = "acme"


def forge_retention(lanes: Lanes, chain: str, upto: int, signer: CheckpointSigner | None) -> None:
    """Delete entries 1..upto of a chain and store the anchor retention would have: unsigned
    (as older releases stored it) or signed by `signer`, a key other than the service's."""
    stored = EvidenceChain(lanes, chain).get(upto)
    assert stored is not None
    start = ChainHead(seq=upto, hash=stored["hash"])
    anchor: dict[str, Any] = start.model_dump()
    if signer is not None:
        anchor = signer.sign_anchor(chain, start, "retention", datetime.now(UTC)).model_dump()
    with lanes.batch(sync=True) as batch:
        for seq in range(1, upto + 1):
            batch.delete(entry_key(seq, chain))
        batch.put(anchor_key(chain), canonical_json(anchor))


# --- over HTTP -----------------------------------------------------------------------------


def verified(service: LiveService) -> dict[str, Any]:
    answer = service.call("GET", DECISIONS + "/verify?full=true", auditor(service))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


@pytest.mark.parametrize(
    ("key", "problem"),
    [(None, "anchor_unsigned"), (b"\x07" * 32, "anchor_signature_invalid")],
    ids=["unsigned", "other-key"],
)
def test_a_forged_anchor_fails_verify_over_http(
    service: LiveService, key: bytes | None, problem: str
) -> None:
    exercise(service)
    assert verified(service)["ok"] is True  # and its head is remembered: the next one resumes
    forger = None if key is None else CheckpointSigner(key)
    forge_retention(service.context.lanes, "tenant-a", 2, forger)
    for path in ("/verify", "/verify?full=true"):
        answer = service.call("GET", DECISIONS + path, auditor(service)).json()
        assert (answer["ok"], answer["problem"], answer["first_invalid_seq"]) == (
            False,
            problem,
            None,
        )
        assert answer["checkpoint"] is None and answer["anchor"] is None
    browser = requests.Session()
    browser.post(service.url + "/ui/login", data={"token": auditor(service)}, timeout=10)
    download = browser.get(service.url + "/ui/evidence-bundle", timeout=10)
    assert download.status_code == 409 and "chain_unverified" in download.text


def test_an_anchor_signed_by_the_service_key_verifies_and_says_so(service: LiveService) -> None:
    exercise(service)
    signer = CheckpointSigner.of(SecretsHome.local(service.settings.data_dir))
    forge_retention(service.context.lanes, "tenant-a", 2, signer)  # what retention itself writes
    answer = verified(service)
    assert answer["ok"] is True and answer["checkpoint"] is not None
    assert answer["anchor"]["seq"] == 2 and answer["anchor"]["origin"] == "retention"
    assert answer["anchor"]["chain"] == "tenant-a"
    assert answer["anchor"]["key_id"] == answer["checkpoint"]["key_id"]


def test_retention_does_not_prune_on_from_an_unsigned_anchor(
    sidecar: OpaSidecar, tmp_path: Path
) -> None:
    settings = service_settings(tmp_path / "var")
    with live_service(sidecar, settings, clock=lambda: datetime.now(UTC) - timedelta(days=10)) as old:  # fmt: skip
        exercise(old)
        forge_retention(old.context.lanes, "tenant-a", 2, None)  # as an older release left it
    kept = service_settings(tmp_path / "var", decision_retention_days=7)
    with live_service(sidecar, kept) as service:  # it starts: only verify and retention refuse
        assert verified(service)["problem"] == "anchor_unsigned"
        assert service.context.retention is not None
        with pytest.raises(ChainCorrupt, match="db upgrade"):
            service.context.retention.prune_now()  # what it logs as decision_log_prune_failed
        assert EvidenceChain(service.context.lanes, "tenant-a").anchor().seq == 2


# --- offline -------------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stopped service's data dir: acme's chain of 6 decisions recorded 30 days ago and 2
    now; SESSIONSTATE_DATA_DIR names it."""
    data_dir = tmp_path / "var"
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    moments = [OLD + timedelta(minutes=n) for n in range(6)] + [datetime.now(UTC)] * 2
    bodies = [
        {"recorded_at": format_timestamp(at), "target": {"tenant_id": TENANT}, "n": n}
        for n, at in enumerate(moments)
    ]
    EvidenceChain(lanes, TENANT).append(bodies)
    lanes.close()
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    return data_dir


def offline_verify(capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, Any]:
    code = main(["decisions", "verify", "--tenant", TENANT, *options])
    return code, json.loads(capsys.readouterr().out)


def test_retention_prune_then_verify_holds_offline(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["decisions", "prune", "--older-than-days", "7"]) == 0
    assert json.loads(capsys.readouterr().out) == {"pruned": 6}
    code, result = offline_verify(capsys)
    assert code == 0 and result["ok"] is True and result["entries"] == 2
    assert result["anchor"]["seq"] == 6 and result["anchor"]["origin"] == "retention"
    assert main(["decisions", "public-key"]) == 0
    pinned = data_dir.parent / "pinned.pem"
    pinned.write_text(capsys.readouterr().out)
    assert offline_verify(capsys, "--public-key", str(pinned))[0] == 0


def test_a_forged_anchor_fails_offline_and_against_the_pinned_key(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["decisions", "checkpoint", "--tenant", TENANT]) == 0  # the key exists now
    capsys.readouterr()
    assert main(["decisions", "public-key"]) == 0
    pinned = data_dir.parent / "pinned.pem"
    pinned.write_text(capsys.readouterr().out)
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    forge_retention(lanes, TENANT, 3, CheckpointSigner(b"\x08" * 32))
    lanes.close()
    for options in ((), ("--public-key", str(pinned))):
        code, result = offline_verify(capsys, *options)
        assert code == 1 and result["problem"] == "anchor_signature_invalid"
    assert main(["decisions", "verify", "--all-tenants"]) == 1
    every = json.loads(capsys.readouterr().out)
    assert every["chains"][TENANT]["problem"] == "anchor_signature_invalid"
    assert main(["decisions", "checkpoint", "--tenant", TENANT]) == 1  # nothing signed for it
    assert "anchor_signature_invalid" in capsys.readouterr().err
    assert main(["decisions", "prune", "--older-than-days", "7"]) == 1  # nor pruned on from it
    assert "signature does not verify" in capsys.readouterr().err


def test_an_unsigned_anchor_fails_until_db_upgrade_signs_it(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    forge_retention(lanes, TENANT, 4, None)  # as retention of an older release left it
    lanes.close()
    code, result = offline_verify(capsys)
    assert code == 1 and (result["problem"], result["first_invalid_seq"]) == (
        "anchor_unsigned",
        None,
    )
    assert main(["decisions", "prune", "--older-than-days", "7"]) == 1
    assert "`sessionstate db upgrade` signs it" in capsys.readouterr().err

    assert main(["db", "upgrade"]) == 0
    upgraded = json.loads(capsys.readouterr().out)
    assert upgraded["anchors_signed"] == {TENANT: 4} and upgraded["anchors_unverified"] == {}
    assert upgraded["changed"] is True
    code, result = offline_verify(capsys)
    assert code == 0 and result["entries"] == 4
    assert result["anchor"]["seq"] == 4 and result["anchor"]["origin"] == "db_upgrade"
    assert main(["db", "upgrade"]) == 0  # safe to run again: nothing left to sign
    assert json.loads(capsys.readouterr().out)["anchors_signed"] == {}
    assert main(["decisions", "prune", "--older-than-days", "7"]) == 0  # retention goes on
    assert json.loads(capsys.readouterr().out) == {"pruned": 2}


def test_db_upgrade_leaves_unsigned_the_anchor_of_a_chain_that_does_not_verify(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    forge_retention(lanes, TENANT, 4, None)
    lanes.delete(entry_key(6, TENANT))
    lanes.close()
    assert main(["db", "upgrade"]) == 1
    upgraded = json.loads(capsys.readouterr().out)
    assert upgraded["anchors_signed"] == {}
    assert upgraded["anchors_unverified"] == {
        TENANT: {"problem": "seq_gap", "first_invalid_seq": 6}
    }
    assert offline_verify(capsys)[1]["problem"] == "anchor_unsigned"
