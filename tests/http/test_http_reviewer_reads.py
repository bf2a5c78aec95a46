"""Reviewer reads over HTTP that do not grow with the log: verify resumes from the head the
last verify signed (`?full=true` walks it all), export pages by cursor, and the reviewer's
page says from where its status was walked."""

from __future__ import annotations

import json
import re

from service.api.v1 import NEXT_CURSOR_HEADER
from store.canonical import canonical_json
from store.chain.checkpoints import CheckpointSigner
from store.chain.entry import parse_entry
from store.chain.keys import entry_key
from store.chain.signed_head import verified_head_key
from store.secrets import SecretsHome
from tests.support.live import LiveService

DECISIONS = "/v1/decisions"


def auditor(service: LiveService, tenant: str = "tenant-a") -> str:
    return service.token("auditor", sub="au-1", tenant=tenant, workspace=None, session=None)


def some_decisions(service: LiveService, count: int = 6) -> None:
    """count reads of a session with no record (each an allowed decision answered 404)."""
    for _ in range(count):
        answer = service.call("GET", service.session_path() + "/state", service.token())
        assert answer.status_code == 404


def test_verify_resumes_from_the_head_the_last_verify_signed(service: LiveService) -> None:
    some_decisions(service)
    first = service.call("GET", DECISIONS + "/verify", auditor(service)).json()
    assert first["ok"] is True and first["resumed_from"] is None
    some_decisions(service, 3)
    second = service.call("GET", DECISIONS + "/verify", auditor(service)).json()
    assert second["ok"] is True
    assert second["resumed_from"] == first["checkpoint"]
    # its own entry, and the three reads, came after the first head
    assert second["entries"] == first["entries"] + 4
    assert second["checkpoint"]["seq"] == second["entries"]
    whole = service.call("GET", DECISIONS + "/verify?full=true", auditor(service)).json()
    assert whole["ok"] is True and whole["resumed_from"] is None
    assert whole["entries"] == second["entries"] + 1


def test_verify_finds_an_entry_edited_after_the_remembered_head(service: LiveService) -> None:
    some_decisions(service)
    first = service.call("GET", DECISIONS + "/verify", auditor(service)).json()
    some_decisions(service, 2)
    seq = first["checkpoint"]["seq"] + 2
    key = entry_key(seq, "tenant-a")
    stored = parse_entry(service.context.lanes.get(key) or b"")
    assert stored is not None
    service.context.lanes.put(key, canonical_json(stored | {"recorded_at": "2020-01-01T00:00:00Z"}))
    again = service.call("GET", DECISIONS + "/verify", auditor(service)).json()
    assert again["resumed_from"] == first["checkpoint"]
    assert (again["ok"], again["problem"], again["first_invalid_seq"]) == (
        False,
        "hash_mismatch",
        seq,
    )
    assert again["checkpoint"] is None


def test_a_remembered_head_written_into_the_store_is_not_trusted(service: LiveService) -> None:
    some_decisions(service)
    service.call("GET", DECISIONS + "/verify", auditor(service))
    key_id = CheckpointSigner.of(SecretsHome.local(service.settings.data_dir)).key_id
    service.context.lanes.put(verified_head_key("tenant-a", key_id), b'{"seq": 999}')
    again = service.call("GET", DECISIONS + "/verify", auditor(service)).json()
    assert again["ok"] is True and again["resumed_from"] is None


def test_verify_takes_only_full(service: LiveService) -> None:
    before = len(
        service.call("GET", DECISIONS + "?limit=1000", auditor(service)).json()["decisions"]
    )
    for query in ("full=yes", "fast=true", "full=true&full2=x"):
        answer = service.call("GET", f"{DECISIONS}/verify?{query}", auditor(service))
        assert answer.status_code == 422, query
        assert answer.json()["reason"] == "validation_failed"
        assert "fast" not in answer.text and "full2" not in answer.text
    listed = service.call("GET", DECISIONS + "?limit=1000", auditor(service)).json()["decisions"]
    assert len(listed) == before + 1  # the list itself: refusals before a decision make none


def test_an_export_with_a_limit_is_a_page_with_the_next_cursor(service: LiveService) -> None:
    some_decisions(service, 7)
    seqs: list[int] = []
    path = DECISIONS + "/export?limit=3&action=read"
    while True:
        answer = service.call("GET", path, auditor(service))
        assert answer.status_code == 200
        lines = [json.loads(line) for line in answer.text.splitlines()]
        assert len(lines) <= 3
        seqs += [line["sessionstate"]["seq"] for line in lines]
        cursor = answer.headers.get(NEXT_CURSOR_HEADER)
        if cursor is None:
            break
        path = f"{DECISIONS}/export?limit=3&action=read&cursor={cursor}"
    whole = service.call("GET", DECISIONS + "/export?action=read", auditor(service)).text
    assert (
        NEXT_CURSOR_HEADER
        not in service.call("GET", DECISIONS + "/export", auditor(service)).headers
    )
    assert seqs == [json.loads(line)["sessionstate"]["seq"] for line in whole.splitlines()]
    assert len(seqs) == 7


def test_the_reviewers_page_says_from_where_it_walked(service: LiveService) -> None:
    some_decisions(service)
    service.http.cookies.set("sessionstate_ui", auditor(service), path="/ui")
    first = service.call("GET", "/ui/decisions")
    assert first.status_code == 200 and "Chain verified" in first.text
    assert "walked now from the head verified at" not in first.text
    assert "Read now: seq 1&ndash;" in first.text
    assert "Last walk of the whole chain (a verify)" in first.text
    second = service.call("GET", "/ui/decisions")
    assert "Chain verified" in second.text
    assert "walked now from the head verified at" in second.text
    # what it read now, and the whole walk (the first view's) that vouches for the rest
    resumed = re.search(r"walked now from the head verified at \S+ \(seq (\d+)\)", second.text)
    assert resumed is not None
    assert f"Read now: seq {resumed.group(1)}&ndash;" in second.text
    assert "Last walk of the whole chain (a verify)" in second.text
