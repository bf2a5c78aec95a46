"""`serve --workers 2` looks like one service: metrics added up over every worker, the parent's
policy reloads told by every worker, and one `/readyz` answer that covers both workers.

A real `sessionstate serve --workers 2` on a real PostgreSQL and a real OPA sidecar; each
request below opens a connection of its own, so the kernel spreads them over the workers
(`X-Sessionstate-Worker` names the one that answered).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from service.policy.reload import STATUS_FILE, read_status
from service.runtime.worker_beats import STALE_SECONDS
from tests.runtime.test_postgres_service import approve, state_path, stop, token
from tests.support.paths import POLICY_DIR
from tests.support.processes import pause
from tests.support.served import ROOT, Served, start

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
READS = "/v1/tenants/<tenant_id>/workspaces/<workspace_id>/sessions/<session_id>/state"
ROUNDS = 10
READS_PER_ROUND = 7


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    copied = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, copied)
    return copied


@pytest.fixture
def two_workers(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path, policies: Path
) -> Iterator[Served]:
    env = {"SESSIONSTATE_STORE": postgres_conninfo, "SESSIONSTATE_POLICY_DIR": str(policies)}
    served = start(opa_bin, tmp_path / "var", tmp_path, env, args=("--workers", "2"))
    yield served
    stop(served)


def _get(served: Served, path: str, **headers: str) -> requests.Response:
    """A request on a connection of its own: whichever worker the kernel picks answers."""
    return requests.get(served.url + path, headers=headers | {"Connection": "close"}, timeout=10)


def _scrape(served: Served) -> tuple[str, Samples]:
    answer = _get(served, "/metrics")
    assert answer.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return answer.headers["X-Sessionstate-Worker"], samples


def _from_each_worker(
    served: Served, ask: Callable[[], requests.Response]
) -> list[requests.Response]:
    """Ask until both workers answered (each answer on a fresh connection); every answer."""
    answers: list[requests.Response] = []
    workers: set[str] = set()
    for _ in range(200):
        answer = ask()
        answers.append(answer)
        workers.add(answer.headers["X-Sessionstate-Worker"])
        if len(workers) == 2:
            return answers
    raise AssertionError(f"only {workers} answered")


def _counters(samples: Samples) -> Samples:
    """The samples that may only grow: counters, histogram buckets, counts and sums."""
    return {
        key: value
        for key, value in samples.items()
        if key[0].endswith(("_total", "_bucket", "_count", "_sum"))
    }


def _reads(samples: Samples) -> float:
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "sessionstate_http_requests_total"
        and dict(labels).get("route") == READS
        and dict(labels).get("method") == "GET"
    )


@pytest.mark.slow
def test_scrapes_add_up_every_workers_requests_and_never_go_backwards_even_over_a_restart(
    two_workers: Served,
) -> None:
    served = two_workers
    approve(served.url)
    headers = {"Authorization": f"Bearer {token('model-service', 'm')}"}
    made = 0
    scrapes: list[tuple[str, Samples]] = []
    readers: set[str] = set()
    for _ in range(ROUNDS):
        for _ in range(READS_PER_ROUND):
            read = _get(served, state_path("m"), **headers)
            assert read.status_code == 404, read.text  # nothing written: decided and answered
            readers.add(read.headers["X-Sessionstate-Worker"])
            made += 1
        scrapes.append(_scrape(served))
        # Every read made so far, whichever worker made it and whichever answers the scrape.
        assert _reads(scrapes[-1][1]) == made
    while len({worker for worker, _ in scrapes}) < 2 and len(scrapes) < 200:
        scrapes.append(_scrape(served))  # ten on one worker: once in 512 runs
    assert len({worker for worker, _ in scrapes}) == 2
    assert len(readers) == 2  # both workers' reads were in the sums
    for (_, before), (worker, after) in pairwise(scrapes):
        for key, value in _counters(before).items():
            assert after.get(key, 0.0) >= value, (worker, key, value, after.get(key))
    last = scrapes[-1][1]
    assert _reads(last) == made
    decided = sum(
        value
        for (name, labels), value in last.items()
        if name == "sessionstate_decisions_total" and dict(labels)["action"] == "read"
    )
    assert decided == made
    # The parent's policy source, told by every worker.
    for _, samples in scrapes:
        assert samples[("sessionstate_policy_source_valid", ())] == 1.0
        assert samples[("sessionstate_policy_reloads_total", (("outcome", "loaded"),))] == 0
        assert samples[("sessionstate_store_writable", ())] == 1.0
        assert samples[("sessionstate_store_write_failures_total", ())] == 0
    # A worker killed and started again: its counts stay in the sums.
    killed = scrapes[-1][0]
    os.kill(int(killed.split(":")[1]), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the killed worker was not started again"
        try:
            worker, after = _scrape(served)
        except requests.RequestException:  # a connection the killed worker had accepted
            continue
        assert _reads(after) == made, worker
        for key, value in _counters(last).items():
            assert after.get(key, 0.0) >= value, (worker, key, value, after.get(key))
        if worker.split(":")[0] == killed.split(":")[0] and worker != killed:
            break  # the worker started in the killed one's place answered


@pytest.mark.slow
def test_a_refused_reload_is_told_by_every_workers_readyz_and_metrics(
    two_workers: Served, policies: Path
) -> None:
    served = two_workers
    for ready in _from_each_worker(served, lambda: _get(served, "/readyz")):
        body = ready.json()
        assert (ready.status_code, body["policy_source_valid"], body["warnings"]) == (
            200,
            True,
            [],
        )
        assert body["workers"] == {"count": 2, "up": 2}
    rego = policies / "sessionstate" / "read" / "read.rego"
    rego.write_text(rego.read_text().replace("decision :=", "decision :=:= {"))
    reloaded = subprocess.run(
        [sys.executable, "-m", "service.cli", "policy", "reload"],
        env={**os.environ, "SESSIONSTATE_DATA_DIR": str(served.data_dir)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert reloaded.returncode == 1, reloaded.stderr  # refused: the last good set decides
    status = read_status(served.data_dir / STATUS_FILE)
    assert status is not None and status.outcome == "invalid"
    for ready in _from_each_worker(served, lambda: _get(served, "/readyz")):
        body = ready.json()
        assert ready.status_code == 200, body  # a refused edit is no outage
        assert body["policy_source_valid"] is False
        assert body["warnings"] == ["policy_source_invalid"]
        assert body["policy_revision"] == status.revision
    for scraped in _from_each_worker(served, lambda: _get(served, "/metrics")):
        assert "sessionstate_policy_source_valid 0.0" in scraped.text
        assert 'sessionstate_policy_reloads_total{outcome="invalid"} 1.0' in scraped.text


@pytest.mark.slow
def test_a_worker_that_stops_serving_makes_readyz_fail_whichever_worker_answers(
    two_workers: Served,
) -> None:
    served = two_workers
    label = _get(served, "/readyz").headers["X-Sessionstate-Worker"]
    stopped = int(label.split(":")[1])
    pause(stopped)  # alive, but its event loop beats no more
    try:
        deadline = time.monotonic() + 6 * STALE_SECONDS
        while True:  # the other worker answers: connections hashed to the stopped one wait
            try:
                answer = requests.get(
                    served.url + "/readyz", headers={"Connection": "close"}, timeout=1
                )
            except requests.RequestException:
                continue
            if answer.status_code == 503:
                break
            assert time.monotonic() < deadline, "readyz stayed ready"
            time.sleep(0.2)
        body = answer.json()
        assert answer.headers["X-Sessionstate-Worker"] != label
        assert body["ready"] is False and body["reasons"] == ["worker_unavailable"]
        assert body["workers"] == {"count": 2, "up": 1}
    finally:
        os.kill(stopped, signal.SIGCONT)
    # Beating again, it is counted again by whichever worker answers.
    deadline = time.monotonic() + 6 * STALE_SECONDS
    while _get(served, "/readyz").status_code != 200:
        assert time.monotonic() < deadline, "readyz stayed unready"
        time.sleep(0.2)
    for ready in _from_each_worker(served, lambda: _get(served, "/readyz")):
        assert ready.json()["workers"] == {"count": 2, "up": 2}
