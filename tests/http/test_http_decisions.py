"""The compliance decision log end to end: every decision kept, chained, scoped to its tenant."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from service.cli import main
from service.policy.sidecar import OpaSidecar
from store.canonical import canonical_json
from store.chain.keys import chain_name, entry_key
from store.key_codec import LaneKey, TenantResourceLane
from tests.support.factories import state_input
from tests.support.live import LiveService, live_service, service_settings

DECISIONS = "/v1/decisions"


def auditor(service: LiveService, tenant: str = "tenant-a") -> str:
    return service.token("auditor", sub="au-1", tenant=tenant, workspace=None, session=None)


def listed(service: LiveService, token: str | None = None, **params: Any) -> list[dict[str, Any]]:
    """Every page of the listing, following next_cursor."""
    entries: list[dict[str, Any]] = []
    query = dict(params)
    while True:
        answer = service.http.get(
            service.url + DECISIONS,
            params=query,
            headers={"Authorization": f"Bearer {token or auditor(service)}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["decision"]["action"] == "decisions.read"
        entries += body["decisions"]
        if body["next_cursor"] is None:
            return entries
        query["cursor"] = body["next_cursor"]


def exercise(service: LiveService) -> None:
    """One of each: a grant, a preview, a write, a read, a replay, a denial, a bad token."""
    service.approve()
    path = service.session_path()
    assert (
        service.call(
            "POST", path + "/state/preview", service.token(), json=state_input()
        ).status_code
        == 200
    )
    assert (
        service.call("PUT", path + "/state", service.token(), json=state_input()).status_code == 201
    )
    assert service.call("GET", path + "/state", service.token()).status_code == 200
    assert (
        service.call("POST", path + "/replay-preview", service.token(), json={}).status_code == 200
    )
    assert service.call("GET", path + "/state", service.token(tenant="tenant-b")).status_code == 403
    assert service.call("GET", path + "/state", "not-a-token").status_code == 401


def test_every_decision_is_kept_with_its_outcome(service: LiveService) -> None:
    exercise(service)
    entries = listed(service)
    summary = [
        (
            e["decision"]["action"],
            e["decision"]["allow"],
            e["outcome"]["status"],
            e["outcome"]["applied"],
        )
        for e in entries
    ]
    assert summary == [
        ("approval.grant", True, 201, True),
        ("preview", True, 200, False),
        ("write", True, 201, True),
        ("read", True, 200, False),
        ("replay", True, 200, False),
        ("read", False, 403, False),
    ]  # the 401 made no decision, so it has no entry
    assert [e["seq"] for e in entries] == sorted(e["seq"] for e in entries)
    write = entries[2]
    assert write["actor"] == {
        "sub": "svc-1",
        "roles": ["model-service"],
        "tenant_id": "tenant-a",
        "workspace_id": "ws-1",
        "session_id": "chat-1",
    }
    assert write["target"] == {
        "tenant_id": "tenant-a",
        "workspace_id": "ws-1",
        "session_id": "chat-1",
    }
    assert write["input"]["record"]["counts"]["turns"] == 2
    assert write["input"]["approval"]["operator"] == "op-1"
    assert write["hash"].startswith("sha256:")
    assert write["prev_hash"] == entries[1]["hash"]


def test_approvals_commit_with_the_entry_that_names_them(service: LiveService) -> None:
    approval = service.approve()
    first = service.call(
        "DELETE",
        f"/v1/tenants/tenant-a/workspaces/ws-1/approvals/{approval['approval_id']}",
        service.operator(),
    )
    again = service.call(
        "DELETE",
        f"/v1/tenants/tenant-a/workspaces/ws-1/approvals/{approval['approval_id']}",
        service.operator(),
    )
    assert (first.status_code, again.status_code) == (204, 204)
    outcomes = [
        e["outcome"] for e in listed(service) if e["decision"]["action"].startswith("approval.")
    ]
    assert outcomes == [
        {"status": 201, "applied": True, "approval_id": approval["approval_id"]},
        {"status": 204, "applied": True, "approval_id": approval["approval_id"]},
        {"status": 204, "applied": False, "approval_id": approval["approval_id"]},
    ]


def test_an_approval_whose_entry_cannot_be_kept_is_not_granted(service: LiveService) -> None:
    service.context.journal.close()
    answer = service.call(
        "POST",
        "/v1/tenants/tenant-a/workspaces/ws-1/approvals",
        service.operator(),
        json={"ttl_seconds": 60, "reason": "x"},
    )
    assert answer.status_code == 503
    assert answer.json()["reason"] == "decision_log_unavailable"
    assert list(service.context.lanes.scan(TenantResourceLane.APPROVAL_PACKET)) == []


def test_every_applied_write_has_its_entry(service: LiveService) -> None:
    service.approve()
    path = service.session_path()
    digests = []
    for n in range(3):
        answer = service.call(
            "PUT", path + "/state", service.token(), json=state_input(state_id=f"s{n}")
        )
        digests.append(answer.json()["record"]["state_digest"])
    stale = service.call(
        "PUT", path + "/state", service.token(), json=state_input(), headers={"If-None-Match": "*"}
    )
    assert stale.status_code == 412
    writes = listed(service, action="write")
    applied = [e["input"]["record"]["state_digest"] for e in writes if e["outcome"]["applied"]]
    assert applied == digests
    assert [e["outcome"]["status"] for e in writes] == [201, 200, 200, 412]


def test_an_auditor_sees_only_its_tenant(service: LiveService) -> None:
    exercise(service)
    assert listed(service, auditor(service, "tenant-b")) == []
    other = service.call("GET", DECISIONS + "?tenant_id=tenant-a", auditor(service, "tenant-b"))
    assert other.status_code == 403
    assert other.json()["reason"] == "cross_tenant_scope_rejected"
    # Another tenant's decision id answers exactly as an unknown one does.
    a_entry = listed(service)[0]["decision"]["decision_id"]
    theirs = service.call("GET", f"{DECISIONS}/{a_entry}", auditor(service, "tenant-b"))
    unknown = service.call(
        "GET", f"{DECISIONS}/00000000-0000-4000-8000-000000000000", auditor(service, "tenant-b")
    )
    assert theirs.status_code == unknown.status_code == 404
    # Each answer names the decision made about the request itself: its id, time, latency and
    # input digest (the path holds the id asked for) are the request's own.
    bodies = [answer.json() for answer in (theirs, unknown)]
    for body in bodies:
        for own in ("decision_id", "evaluated_at", "latency_ms", "input_digest"):
            body["decision"].pop(own)
    assert bodies[0] == bodies[1]
    export = service.call("GET", DECISIONS + "/export", auditor(service, "tenant-b"))
    assert "tenant-a" not in export.text.replace('"tenant_id": "tenant-b"', "")


def test_only_auditors_read_the_log(service: LiveService) -> None:
    answer = service.call("GET", DECISIONS, service.operator())
    assert answer.status_code == 403
    assert answer.json()["reason"] == "role_not_permitted"


def test_filters_and_pagination(service: LiveService) -> None:
    exercise(service)
    everything = listed(service, action="read")
    assert [e["decision"]["allow"] for e in everything] == [True, False]
    assert [e["decision"]["action"] for e in listed(service, allow="false")] == ["read"]
    # Reading the log is a decision too: each page adds an entry the later pages may show.
    paged = [e["seq"] for e in listed(service, limit=2)]
    assert paged == [e["seq"] for e in listed(service) if e["seq"] <= paged[-1]]
    first = listed(service)[0]["decision"]["evaluated_at"]
    assert listed(service, until=first) == []
    assert listed(service, since=first, action="read") == listed(service, action="read")


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=1001",
        "cursor=bm9wZQ",
        "action=delete",
        "allow=yes",
        "since=yesterday",
        "since=2026-01-01T00:00:00",
        "tenant_id=Tenant%20A",
        "colour=red",
    ],
)
def test_bad_queries_are_422(service: LiveService, query: str) -> None:
    answer = service.call("GET", f"{DECISIONS}?{query}", auditor(service))
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"][0] == "query"
    assert answer.json()["detail"] == "The query string breaks the rules listed in `errors`."


def test_one_entry_by_id(service: LiveService) -> None:
    exercise(service)
    wanted = listed(service)[2]
    answer = service.call(
        "GET", f"{DECISIONS}/{wanted['decision']['decision_id']}", auditor(service)
    )
    assert answer.status_code == 200
    assert answer.json()["entry"] == wanted
    missing = service.call("GET", f"{DECISIONS}/no-such-decision", auditor(service))
    assert missing.status_code == 404
    assert missing.json()["reason"] == "decision_not_found"
    assert missing.json()["decision"]["allow"] is True


def test_verify_and_a_signed_checkpoint(service: LiveService) -> None:
    exercise(service)
    answer = service.call("GET", DECISIONS + "/verify", auditor(service))
    body = answer.json()
    assert body["ok"] is True
    assert body["first_invalid_seq"] is None
    assert body["entries"] >= 6
    assert body["checkpoint"]["seq"] == body["entries"]
    assert body["checkpoint"]["head_hash"] == body["head_hash"]
    assert body["checkpoint_public_key"].startswith("-----BEGIN PUBLIC KEY-----")
    assert body["checkpoint"]["signature"]


def test_an_auditor_learns_nothing_of_another_tenants_chain(service: LiveService) -> None:
    """Counts, heads, checkpoints, ids: tenant-b's auditor sees tenant-b's chain only."""
    exercise(service)  # tenant-a's chain, with tenant-b's refused attempt on it
    a_entries = listed(service)
    b_token = auditor(service, "tenant-b")
    for _ in range(2):  # tenant-b's chain: its auditor's own reads
        listed(service, b_token)
    a_verify = service.call("GET", DECISIONS + "/verify", auditor(service)).json()
    b_verify = service.call("GET", DECISIONS + "/verify", b_token).json()
    b_entries = listed(service, b_token)
    assert a_verify["ok"] is b_verify["ok"] is True
    assert {e["target"]["tenant_id"] for e in b_entries} == {"tenant-b"}
    assert [e["seq"] for e in b_entries] == list(range(1, len(b_entries) + 1))
    # b's count, head and checkpoint are b's chain's, not the store's nor a's.
    assert b_verify["entries"] == b_verify["checkpoint"]["seq"] < a_verify["entries"]
    b_head = next(e for e in b_entries if e["seq"] == b_verify["checkpoint"]["seq"])
    assert b_verify["head_hash"] == b_verify["checkpoint"]["head_hash"] == b_head["hash"]
    assert b_verify["checkpoint"]["tenant_id"] == "tenant-b"
    assert a_verify["checkpoint"]["tenant_id"] == "tenant-a"
    a_hashes = {e["hash"] for e in a_entries} | {a_verify["head_hash"]}
    a_ids = {e["decision"]["decision_id"] for e in a_entries}
    assert a_hashes.isdisjoint(e["hash"] for e in b_entries)
    assert a_ids.isdisjoint(e["decision"]["decision_id"] for e in b_entries)
    export = service.call("GET", DECISIONS + "/export", b_token)
    assert export.status_code == 200
    assert not any(id_ in export.text for id_ in a_ids)
    assert not any(hash_ in export.text for hash_ in a_hashes)
    # Every one of a's ids answers b's auditor exactly as an unknown id does.
    unknown = service.call("GET", f"{DECISIONS}/00000000-0000-4000-8000-000000000001", b_token)
    for id_ in sorted(a_ids)[:3]:
        theirs = service.call("GET", f"{DECISIONS}/{id_}", b_token)
        assert (
            (theirs.status_code, theirs.json()["reason"])
            == (
                unknown.status_code,
                unknown.json()["reason"],
            )
            == (404, "decision_not_found")
        )
        assert theirs.json()["detail"] == unknown.json()["detail"]
        assert id_ not in theirs.text


def test_verify_names_the_first_edited_entry(service: LiveService) -> None:
    exercise(service)
    victim = listed(service)[3]
    edited = dict(victim, outcome={"status": 200, "applied": True})
    service.context.lanes.put(
        entry_key(victim["seq"], chain_name(victim["target"]["tenant_id"])),
        canonical_json(edited),
    )
    body = service.call("GET", DECISIONS + "/verify", auditor(service)).json()
    assert body["ok"] is False
    assert body["first_invalid_seq"] == victim["seq"]
    assert body["problem"] == "hash_mismatch"
    assert body["checkpoint"] is None  # a broken chain gets no checkpoint to vouch for it


def test_export_speaks_opa_decision_log_field_names(service: LiveService) -> None:
    exercise(service)
    answer = service.call("GET", DECISIONS + "/export?action=write", auditor(service))
    assert answer.headers["Content-Type"] == "application/x-ndjson"
    assert answer.headers["Sessionstate-Decision-Id"]
    (line,) = answer.text.splitlines()
    event = json.loads(line)
    assert event["path"] == "sessionstate/write/decision"
    assert event["result"] == {"allow": True, "reasons": []}
    assert event["bundles"]["sessionstate"]["revision"].startswith("sha256:")
    assert event["input"]["action"] == "write"
    assert event["decision_id"] == event["sessionstate"]["decision"]["decision_id"]
    assert event["timestamp"].endswith("Z")


def test_concurrent_requests_keep_one_gapless_chain(service: LiveService) -> None:
    service.approve()
    errors: list[int] = []

    def reader() -> None:
        for _ in range(10):
            status = service.call(
                "GET", service.session_path() + "/state", service.token()
            ).status_code
            if status != 404:
                errors.append(status)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    seqs = [e["seq"] for e in listed(service)]
    assert seqs == list(range(seqs[0], seqs[0] + 81))
    assert service.call("GET", DECISIONS + "/verify", auditor(service)).json()["ok"] is True


def test_a_decision_that_cannot_be_kept_is_not_acted_on(service: LiveService) -> None:
    service.approve()
    service.context.journal.close()
    answer = service.call(
        "PUT", service.session_path() + "/state", service.token(), json=state_input()
    )
    assert answer.status_code == 503
    assert answer.json()["reason"] == "decision_log_unavailable"
    assert (
        service.context.lanes.get(
            LaneKey(TenantResourceLane.SESSION_STATE, "tenant-a", "ws-1", "chat-1")
        )
        is None
    )
    read = service.call("GET", service.session_path() + "/state", service.token())
    assert read.status_code == 503


# --- offline review --------------------------------------------------------------------


def test_offline_review_of_a_stopped_service(
    service: LiveService, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    exercise(service)
    data_dir = Path(service.settings.data_dir)
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["decisions", "verify"]) == 2  # the service still holds the database
    assert "stop the service first" in capsys.readouterr().err
    service.context.close()

    assert main(["decisions", "verify"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["decisions", "checkpoint"]) == 0
    checkpoint = data_dir.parent / "checkpoint.json"
    checkpoint.write_text(capsys.readouterr().out)
    assert main(["decisions", "export", "--tenant", "tenant-a"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 6
    assert main(["decisions", "tail", "-n", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tail = [json.loads(line) for line in lines]
    assert [e["decision"]["action"] for e in tail] == ["replay", "read"]
    # As stored: each line is the entry's RFC 8785 form, byte for byte.
    assert [rfc8785.dumps(entry).decode() for entry in tail] == lines

    # Truncate the tail: the kept checkpoint shows it, and so does a plain verify, held
    # against the head the offline checkpoint signed (the data dir remembers it).
    from store.backends.leveldb import LevelDBLaneStore

    lanes = LevelDBLaneStore(data_dir / "leveldb")
    lanes.delete(entry_key(tail[-1]["seq"], chain_name(tail[-1]["target"]["tenant_id"])))
    lanes.close()
    assert main(["decisions", "verify"]) == 1
    assert json.loads(capsys.readouterr().out)["problem"] == "truncated_before_checkpoint"
    assert main(["decisions", "verify", "--checkpoint", str(checkpoint)]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["problem"] == "truncated_before_checkpoint"
    assert result["first_invalid_seq"] == tail[-1]["seq"]

    # A reviewer pins the public key apart from the data dir and verifies with it.
    assert main(["decisions", "public-key"]) == 0
    pinned = data_dir.parent / "checkpoint.pub.pem"
    pinned.write_text(capsys.readouterr().out)
    assert (
        main(["decisions", "verify", "--checkpoint", str(checkpoint), "--public-key", str(pinned)])
        == 1
    )
    assert json.loads(capsys.readouterr().out)["problem"] == "truncated_before_checkpoint"
    from store.chain.checkpoints import CheckpointSigner

    other = data_dir.parent / "other.pub.pem"
    other.write_bytes(CheckpointSigner(b"\x01" * 32).public_key_pem)
    assert (
        main(["decisions", "verify", "--checkpoint", str(checkpoint), "--public-key", str(other)])
        == 1
    )
    assert json.loads(capsys.readouterr().out)["problem"] == "checkpoint_signature_invalid"


@pytest.mark.parametrize(
    "argv", [["tail", "-n", "0"], ["prune", "--older-than-days", "0"], ["tail", "-n", "-3"]]
)
def test_review_counts_must_be_positive(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["decisions", *argv])
    assert "must be 1 or more" in capsys.readouterr().err


def test_verify_without_a_key_never_creates_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "leveldb").mkdir()
    checkpoint = tmp_path / "cp.json"
    checkpoint.write_text("{}")
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(tmp_path))
    assert main(["decisions", "verify", "--checkpoint", str(checkpoint)]) == 2
    assert "not a sessionstate checkpoint" in capsys.readouterr().err
    assert main(["decisions", "public-key"]) == 2
    assert "no checkpoint key" in capsys.readouterr().err
    assert not (tmp_path / "secrets" / "checkpoint.key").exists()


def test_retention_prunes_old_entries_and_what_remains_verifies(
    sidecar: OpaSidecar, tmp_path: Path
) -> None:
    settings = service_settings(tmp_path / "var")
    ten_days_ago = lambda: datetime.now(UTC) - timedelta(days=10)  # noqa: E731
    with live_service(sidecar, settings, clock=ten_days_ago) as old:
        exercise(old)
        old_count = len(listed(old))
    kept = service_settings(tmp_path / "var", decision_retention_days=7)
    with live_service(sidecar, kept) as service:
        deadline = time.monotonic() + 10
        chain = service.context.journal.chain("tenant-a")
        while chain.anchor().seq == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        anchor = chain.anchor()
        assert (
            anchor.seq >= old_count - 1
        )  # all old entries but the newest one (the head stays provable)
        entries = listed(service)
        assert all(e["seq"] > anchor.seq for e in entries)
        verify = service.call("GET", DECISIONS + "/verify", auditor(service)).json()
        assert verify["ok"] is True
        # The anchor retention stored is signed with the checkpoint key, and verify checked it.
        assert (verify["anchor"]["seq"], verify["anchor"]["origin"]) == (anchor.seq, "retention")
        old_id = "no-longer-kept"
        assert service.call("GET", f"{DECISIONS}/{old_id}", auditor(service)).status_code == 404


def test_paging_ends_at_the_head_the_first_page_saw(service: LiveService) -> None:
    """Each page read is itself logged; following cursors must still come to an end."""
    exercise(service)
    first = service.call("GET", DECISIONS + "?limit=1", auditor(service)).json()
    seen = [e["seq"] for e in first["decisions"]]
    cursor = first["next_cursor"]
    while cursor is not None:
        page = service.call("GET", f"{DECISIONS}?limit=1&cursor={cursor}", auditor(service)).json()
        seen += [e["seq"] for e in page["decisions"]]
        cursor = page["next_cursor"]
    assert seen == list(range(1, 7))  # the six entries `exercise` made, none of the reads


def test_a_listing_survives_a_tampered_entry_and_verify_names_it(service: LiveService) -> None:
    exercise(service)
    victim = listed(service)[3]
    mangled = {k: v for k, v in victim.items() if k != "decision"}
    service.context.lanes.put(
        entry_key(victim["seq"], chain_name(victim["target"]["tenant_id"])),
        canonical_json(mangled),
    )
    seqs = [e["seq"] for e in listed(service)]
    assert victim["seq"] not in seqs
    assert len(seqs) >= 5
    body = service.call("GET", DECISIONS + "/verify", auditor(service)).json()
    assert (body["ok"], body["first_invalid_seq"]) == (False, victim["seq"])


def test_a_body_that_breaks_the_rules_is_still_called_the_body(service: LiveService) -> None:
    service.approve()
    answer = service.call(
        "PUT", service.session_path() + "/state", service.token(), json={"turns": "no"}
    )
    assert answer.status_code == 422
    assert answer.json()["detail"] == "The request body breaks the rules listed in `errors`."
