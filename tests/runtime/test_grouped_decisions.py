"""Grouped decisions over real HTTP: `sessionstate serve`, its live and shadow OPA sidecars.

Sixteen clients read at once, so requests need decisions while one is in
flight: those go to OPA together, in one query of `sessionstate.batch`. Each
still gets an entry of its own on the chain, which names OPA's decision id of
the query and its index in it, joins with OPA's own decision log event, and
carries the shadow's decision, asked the same way; the chain verifies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.policy.test_shadow_policies import (
    AUDITOR,
    MODEL,
    OPERATOR,
    SESSION_PATH,
    TENANT,
    WORKSPACE,
    served_with_read_refusing_shadow,
)
from tests.support.factories import state_input
from tests.support.hash_recipe import hashes_as_the_recipe_says
from tests.support.served import Served

CLIENTS, READS_EACH = 16, 12


@pytest.fixture
def served(opa_bin: str, tmp_path: Path) -> Iterator[Served]:
    yield from served_with_read_refusing_shadow(opa_bin, tmp_path, 1000)


def _call(served: Served, method: str, path: str, token: str, **kwargs: Any) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return requests.request(method, served.url + path, headers=headers, timeout=10, **kwargs)


def _reads(served: Served) -> list[str]:
    """Each client reads READS_EACH times over its own connection: the decision ids."""

    def client(_: int) -> list[str]:
        with requests.Session() as http:
            http.headers["Authorization"] = f"Bearer {MODEL}"
            ids = []
            for _read in range(READS_EACH):
                answer = http.get(served.url + SESSION_PATH + "/state", timeout=10)
                assert answer.status_code == 200, answer.text
                ids.append(answer.json()["decision"]["decision_id"])
            return ids

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [decision for ids in pool.map(client, range(CLIENTS)) for decision in ids]


def _all_entries(served: Served) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    cursor = ""
    while True:
        answer = _call(served, "GET", f"/v1/decisions?limit=500{cursor}", AUDITOR)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        entries += page["decisions"]
        if not page["next_cursor"]:
            return entries
        cursor = "&cursor=" + page["next_cursor"]


def _opa_events(log: Path) -> dict[str, dict[str, Any]]:
    """OPA's console decision log events, by decision id."""
    events = {}
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("msg") == "Decision Log":
            events[event["decision_id"]] = event
    return events


def test_concurrent_reads_are_decided_in_shared_queries_each_with_its_own_entry(
    served: Served,
) -> None:
    granted = _call(
        served,
        "POST",
        f"/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/approvals",
        OPERATOR,
        json={"ttl_seconds": 600, "reason": "grouped decisions"},
    )
    assert granted.status_code == 201, granted.text
    written = _call(served, "PUT", SESSION_PATH + "/state", MODEL, json=state_input())
    assert written.status_code in (200, 201), written.text

    answered = _reads(served)
    assert len(set(answered)) == CLIENTS * READS_EACH  # every answer its own decision

    entries = {entry["decision"]["decision_id"]: entry for entry in _all_entries(served)}
    assert set(answered) <= set(entries)
    assert all(map(hashes_as_the_recipe_says, entries.values()))
    batched = [
        entries[decision] for decision in answered if "batch" in entries[decision]["decision"]
    ]
    assert batched, "sixteen concurrent clients never shared a query"

    live = _opa_events(served.data_dir / "opa" / "opa.log")
    for entry in batched:
        decision = entry["decision"]
        batch = decision["batch"]
        assert decision["decision_id"] == f"{batch['decision_id']}.{batch['index']}"
        assert decision["allow"] is True and entry["outcome"]["status"] == 200
        event = live[batch["decision_id"]]  # OPA's own record of the query
        assert event["path"] == "sessionstate/batch/decision"
        item = event["input"]["batch"][batch["index"]]
        assert item["package"] == "read" and item["input"] == entry["input"]
        assert event["result"][str(batch["index"])] == {"allow": True, "reasons": []}
    # the shadow was asked too, and refused each read it decided, as its candidate says (a
    # request that found the shadow's threads all busy records it unavailable)
    outcomes = [entries[decision]["shadow"]["outcome"] for decision in answered]
    assert set(outcomes) <= {"allow_lost", "unavailable"}, outcomes
    assert outcomes.count("allow_lost") >= len(outcomes) // 2, outcomes

    shadow = _opa_events(served.data_dir / "opa-shadow" / "opa.log")
    assert any(event["path"] == "sessionstate/batch/decision" for event in shadow.values())
    verified = _call(served, "GET", "/v1/decisions/verify", AUDITOR)
    assert verified.status_code == 200 and verified.json()["ok"] is True
