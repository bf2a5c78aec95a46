"""Entries as hashed (issue 25), over real HTTP: every entry the list, the single-entry route,
the export and the reviewer's page return hashes as docs/compliance.md's recipe says;
`order=desc` reads the log newest first, its cursors down to the oldest entry; one entry's
answer says whether its own hash and its link to the entry before it hold (`hash_ok`)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from service.api.v1 import NEXT_CURSOR_HEADER
from service.cli import main
from service.policy.sidecar import OpaSidecar
from store.canonical import canonical_digest, canonical_json
from store.chain.keys import entry_key
from tests.http.test_http_decisions import DECISIONS, auditor, exercise, listed
from tests.http.test_ui import UI, sign_in
from tests.support.factories import state_input
from tests.support.hash_recipe import hashes_as_the_recipe_says
from tests.support.live import LiveService, live_service, service_settings

AS_STORED = re.compile(r'<pre id="entry-as-stored">(.*?)</pre>', re.DOTALL)


@pytest.fixture
def shadowed(sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    """The service with a shadow policy set (the same policies, on the same OPA: it agrees)."""
    settings = service_settings(tmp_path / "var", shadow_timeout_ms=1000)
    with live_service(sidecar, settings, shadow=sidecar) as live:
        yield live


def one_entry(service: LiveService, decision_id: str) -> dict[str, Any]:
    answer = service.call("GET", f"{DECISIONS}/{decision_id}", auditor(service))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def exported(service: LiveService, query: str = "") -> list[dict[str, Any]]:
    answer = service.call("GET", f"{DECISIONS}/export{query}", auditor(service))
    assert answer.status_code == 200, answer.text
    return [json.loads(line)["sessionstate"] for line in answer.text.splitlines()]


def export_pages(service: LiveService, **params: Any) -> list[dict[str, Any]]:
    """Every page of the export, following its next-cursor header."""
    entries: list[dict[str, Any]] = []
    while True:
        answer = service.http.get(
            f"{service.url}{DECISIONS}/export",
            params=params,
            headers={"Authorization": f"Bearer {auditor(service)}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        entries += [json.loads(line)["sessionstate"] for line in answer.text.splitlines()]
        if NEXT_CURSOR_HEADER not in answer.headers:
            return entries
        params["cursor"] = answer.headers[NEXT_CURSOR_HEADER]


def on_the_page(browser: requests.Session, service: LiveService, decision_id: str) -> str:
    answer = browser.get(f"{service.url}{UI}/{decision_id}", allow_redirects=False, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.text


def shown_as_stored(page: str) -> dict[str, Any]:
    """The entry the page shows as stored, as a reviewer copies it from the page."""
    match = AS_STORED.search(page)
    assert match is not None
    shown: dict[str, Any] = json.loads(html.unescape(match.group(1)))
    return shown


def assert_every_way_of_reading_hashes(service: LiveService, entries: list[dict[str, Any]]) -> None:
    """Each entry as listed, looked up, exported and shown on the page: the same members,
    and each hashes as the recipe says."""
    assert entries
    by_seq = {entry["seq"]: entry for entry in exported(service)}
    browser = sign_in(service, auditor(service))
    for entry in entries:
        assert hashes_as_the_recipe_says(entry), entry["seq"]
        single = one_entry(service, entry["decision"]["decision_id"])
        assert single["entry"] == entry and single["hash_ok"] is True
        assert by_seq[entry["seq"]] == entry
        page = on_the_page(browser, service, entry["decision"]["decision_id"])
        assert shown_as_stored(page) == entry
        assert "Hash and link hold" in page


def test_the_newest_entry_of_a_fresh_log_hashes_as_the_recipe_says(service: LiveService) -> None:
    # As the recipe does it: a request, so an entry; then the newest entry.
    service.call("GET", DECISIONS + "/verify", auditor(service))
    answer = service.call("GET", DECISIONS + "?order=desc&limit=1", auditor(service))
    (newest,) = answer.json()["decisions"]
    assert (newest["seq"], newest["decision"]["action"]) == (1, "decisions.read")
    # Only the members that were stored: no shadow policy set, no migration, no tracing.
    assert "shadow" not in newest and "legacy" not in newest
    assert "trace_id" not in newest["decision"]
    assert hashes_as_the_recipe_says(newest)
    assert_every_way_of_reading_hashes(service, [newest])


def test_every_entry_of_a_longer_log_hashes_as_the_recipe_says(shadowed: LiveService) -> None:
    exercise(shadowed)
    path = shadowed.session_path()
    for _ in range(15):
        preview = shadowed.call(
            "POST", path + "/state/preview", shadowed.token(), json=state_input()
        )
        assert preview.status_code == 200
        assert shadowed.call("GET", path + "/state", shadowed.token()).status_code == 200
        theirs = shadowed.call("GET", path + "/state", shadowed.token(tenant="tenant-b"))
        assert theirs.status_code == 403  # within the denial budget: each one an entry
    entries = listed(shadowed, limit=17)
    assert len(entries) == 6 + 3 * 15
    assert all(entry["shadow"]["outcome"] == "agree" for entry in entries)
    assert {entry["decision"]["action"] for entry in entries} >= {
        "approval.grant",
        "preview",
        "write",
        "read",
        "replay",
    }
    assert_every_way_of_reading_hashes(shadowed, entries)
    # and what the reads above added, newest first
    assert all(map(hashes_as_the_recipe_says, listed(shadowed, order="desc", limit=50)))


def test_newest_first_pages_follow_cursors_down_to_the_oldest_entry(service: LiveService) -> None:
    exercise(service)
    for _ in range(5):
        assert service.call("GET", service.session_path() + "/state", service.token()).ok
    first = service.call("GET", DECISIONS + "?order=desc&limit=4", auditor(service)).json()
    head = first["decisions"][0]["seq"]
    pages = [first["decisions"]]
    cursor = first["next_cursor"]
    while cursor is not None:  # each page adds an entry above the head: none is shown
        query = f"{DECISIONS}?order=desc&limit=4&cursor={cursor}"
        page = service.call("GET", query, auditor(service)).json()
        pages.append(page["decisions"])
        cursor = page["next_cursor"]
    assert all(len(page) <= 4 for page in pages)
    seqs = [entry["seq"] for page in pages for entry in page]
    assert seqs == list(range(head, 0, -1))
    oldest_first = [entry for entry in listed(service) if entry["seq"] <= head]
    assert [entry for page in pages for entry in page] == oldest_first[::-1]
    # filtered, and the export: the same entries in the same order, page by page
    reads = [entry["seq"] for entry in listed(service, action="read", order="desc", limit=1)]
    assert (
        reads
        == [entry["seq"] for entry in oldest_first if entry["decision"]["action"] == "read"][::-1]
    )
    paged = [entry["seq"] for entry in export_pages(service, order="desc", action="read", limit=1)]
    assert paged == reads
    whole = [entry["seq"] for entry in exported(service, "?order=desc&action=read")]
    assert whole == reads


def test_a_cursor_goes_on_only_in_the_order_that_issued_it(service: LiveService) -> None:
    exercise(service)
    desc = service.call("GET", DECISIONS + "?order=desc&limit=2", auditor(service)).json()
    asc = service.call("GET", DECISIONS + "?limit=2", auditor(service)).json()
    for query in (
        f"cursor={desc['next_cursor']}",
        f"order=asc&cursor={desc['next_cursor']}",
        f"order=desc&cursor={asc['next_cursor']}",
    ):
        for path in (DECISIONS, DECISIONS + "/export"):
            answer = service.call("GET", f"{path}?{query}", auditor(service))
            assert answer.status_code == 422, query
            assert answer.json()["errors"] == [
                {"loc": ["query", "cursor"], "rule": "invalid_cursor"}
            ]
    answer = service.call("GET", DECISIONS + "?order=newest", auditor(service))
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"] == ["query", "order"]
    assert "newest" not in answer.text


def test_one_entry_says_whether_its_hash_and_its_link_hold(service: LiveService) -> None:
    exercise(service)
    entries = listed(service)
    victim, after = entries[3], entries[4]
    assert one_entry(service, entries[0]["decision"]["decision_id"])["hash_ok"] is True  # genesis
    key = entry_key(victim["seq"], "tenant-a")

    # Edited in the store, its hash left as it was: its own hash no longer holds.
    edited = victim | {"outcome": {"status": 200, "applied": True, "approval_id": None}}
    service.context.lanes.put(key, canonical_json(edited))
    answer = one_entry(service, victim["decision"]["decision_id"])
    assert answer["hash_ok"] is False
    assert answer["entry"] == edited  # shown as it is stored now
    assert not hashes_as_the_recipe_says(answer["entry"])
    assert one_entry(service, after["decision"]["decision_id"])["hash_ok"] is True
    page = on_the_page(
        sign_in(service, auditor(service)), service, victim["decision"]["decision_id"]
    )
    assert "Hash or link broken" in page and "Hash and link hold" not in page
    assert shown_as_stored(page) == edited

    # Its hash recomputed too: it holds on its own, but the next entry no longer links to it.
    rehashed = edited | {"hash": canonical_digest({k: v for k, v in edited.items() if k != "hash"})}
    service.context.lanes.put(key, canonical_json(rehashed))
    answer = one_entry(service, victim["decision"]["decision_id"])
    assert answer["hash_ok"] is True and hashes_as_the_recipe_says(answer["entry"])
    assert one_entry(service, after["decision"]["decision_id"])["hash_ok"] is False


def test_the_first_entry_after_the_retention_anchor_links_to_it(
    sidecar: OpaSidecar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = service_settings(tmp_path / "var")
    ten_days_ago = lambda: datetime.now(UTC) - timedelta(days=10)  # noqa: E731
    with live_service(sidecar, settings, clock=ten_days_ago) as old:
        exercise(old)
        # the newest old entry, which retention keeps (the head stays provable): this read's
        newest = old.call("GET", DECISIONS + "?limit=1", auditor(old)).json()["decision"]
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(settings.data_dir))
    assert main(["decisions", "prune", "--older-than-days", "7"]) == 0
    with live_service(sidecar, settings) as service:
        first = one_entry(service, newest["decision_id"])
        assert first["entry"]["seq"] == 7 and first["hash_ok"] is True
        assert first["entry"]["prev_hash"] != "sha256:" + "0" * 64  # the anchor's hash
        assert listed(service)[0] == first["entry"]
