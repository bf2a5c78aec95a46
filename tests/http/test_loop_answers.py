"""Liveness and metrics answered on the event loop (`service.http.loop_answers`).

Against `sessionstate serve` as a real process, over real HTTP: the answers
are the app's (headers, counts, log lines), and liveness and metrics answer
while every request thread waits on an OPA that gives no answer.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import pytest
import requests

from service.api.v1 import HEALTHZ, METRICS, READYZ
from service.runtime.serving import THREADS
from tests.support.live import minted_token
from tests.support.processes import pause
from tests.support.served import Served, opa_pid, start

STATE = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1/state"
OPA_TIMEOUT_MS = 4000  # reads wait this long on a paused OPA, holding their threads


@pytest.fixture
def served(opa_bin: str, tmp_path: Path) -> Iterator[Served]:
    running = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        extra_env={"SESSIONSTATE_OPA_TIMEOUT_MS": str(OPA_TIMEOUT_MS)},
    )
    yield running
    if running.process.poll() is None:
        running.process.terminate()
        running.process.wait(20)


def _counted(served: Served, route: str, method: str) -> float:
    text = requests.get(served.url + METRICS, timeout=5).text
    line = f'sessionstate_http_requests_total{{method="{method}",route="{route}",status="200"}}'
    return sum(float(row.split()[-1]) for row in text.splitlines() if row.startswith(line))


def _logged(served: Served, request_id: str) -> list[dict[str, object]]:
    lines = served.log.read_text(errors="replace").splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return [event for event in events if event.get("request_id") == request_id]


def test_liveness_and_metrics_answer_as_the_app_does(served: Served) -> None:
    before = _counted(served, HEALTHZ, "GET")
    answer = requests.get(served.url + HEALTHZ, headers={"X-Request-Id": "probe-1"}, timeout=5)
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.headers["X-Request-Id"] == "probe-1"
    assert _counted(served, HEALTHZ, "GET") == before + 1
    [event] = _logged(served, "probe-1")
    assert (event["event"], event["route"], event["status"]) == ("request", HEALTHZ, 200)

    head = requests.head(served.url + HEALTHZ, headers={"X-Request-Id": "bad id!"}, timeout=5)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Length"] == str(len(answer.content))
    assert head.headers["X-Request-Id"] != "bad id!"  # a malformed id is replaced, never echoed
    assert len(head.headers["X-Request-Id"]) == 16

    scraped = requests.get(served.url + METRICS, timeout=5)
    assert scraped.status_code == 200
    assert scraped.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert scraped.headers["Cache-Control"] == "no-store"
    assert "sessionstate_http_requests_total" in scraped.text
    # What the loop does not answer still goes to the app: another method, another path.
    assert requests.post(served.url + HEALTHZ, timeout=5).status_code == 405
    assert requests.get(served.url + HEALTHZ + "/", timeout=5).status_code == 404


def _read(served: Served, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    return requests.get(served.url + STATE, headers=headers, timeout=30).status_code


def test_liveness_answers_while_every_request_thread_waits_on_opa(served: Served) -> None:
    token = minted_token(sub="svc")
    opa = opa_pid(served.data_dir)
    pause(opa)  # every read's decision waits for OPA's timeout
    try:
        with ThreadPoolExecutor(THREADS + 4) as pool:
            reads = [pool.submit(_read, served, token) for _ in range(THREADS + 4)]
            wait(reads, timeout=1)  # they are all in (none can finish before OPA's timeout)
            probe = requests.get(served.url + HEALTHZ, timeout=OPA_TIMEOUT_MS / 2000)
            scrape = requests.get(served.url + METRICS, timeout=OPA_TIMEOUT_MS / 2000)
            waiting = sum(not read.done() for read in reads)
            # /readyz asks OPA, in a thread: it waits behind the reads.
            with pytest.raises(requests.Timeout):
                requests.get(served.url + READYZ, timeout=OPA_TIMEOUT_MS / 2000)
    finally:
        os.kill(opa, signal.SIGCONT)
    assert (probe.status_code, scrape.status_code) == (200, 200)
    assert waiting == len(reads)  # answered while every read still waited
    assert {read.result() for read in reads} <= {200, 404, 503}  # fail closed, never a 500
