"""Sessions that never end, over real HTTP: the window, the summary, races, v1 records, the client.

Every summary digest here is recomputed in the test from the turn digests in
order (`chain`), as docs/model-service.md tells a model service to do, never
with the service's own code.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
from sessionstate_client import ModelServiceSession, PreconditionFailed, SessionStateClient

from service.policy.sidecar import OpaSidecar
from store.digests import DigestKey
from store.record.inputs import SessionStateInput
from store.record.state_record import SessionStateRecord
from store.session_state import state_key
from tests.support.factories import scope, state_input, v1_record_bytes
from tests.support.live import DIGEST_KEY, LiveService, live_service, service_settings

SCOPE = scope()
WINDOW = 16
TURN_KEY = DigestKey(b"model-service-own-key-0123456789", key_id="svc")


def chain(turns: list[dict[str, Any]]) -> str:
    digest = "sha256:" + "0" * 64
    for turn in turns:
        line = f"{digest}\n{turn['turn_id']}\n{turn['role']}\n{turn['payload_digest']}"
        digest = "sha256:" + hashlib.sha256(line.encode("utf-8")).hexdigest()
    return digest


def new_turns(start: int, count: int) -> list[dict[str, Any]]:
    return [
        {
            "turn_id": f"turn-{n}",
            "role": "user" if n % 2 == 0 else "assistant",
            "payload_digest": "sha256:" + hashlib.sha256(f"text {n}".encode()).hexdigest(),
            "token_estimate": n % 11,
        }
        for n in range(start, start + count)
    ]


def put(
    service: LiveService, turns: list[dict[str, Any]], etag: str | None, **body: Any
) -> requests.Response:
    headers = {"If-None-Match": "*"} if etag is None else {"If-Match": etag}
    return service.call(
        "PUT",
        service.session_path() + "/state",
        service.token(),
        json=state_input(turns=turns, **body),
        headers=headers,
    )


def stored(service: LiveService) -> tuple[dict[str, Any], str]:
    answer = service.call("GET", service.session_path() + "/state", service.token())
    assert answer.status_code == 200, answer.text
    return answer.json()["read_report"]["record"], answer.headers["ETag"]


@pytest.fixture
def windowed(sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    """The service with a window of 16 turns, durable writes on, a workspace approval."""
    settings = service_settings(tmp_path / "var", max_turns_kept=WINDOW)
    with live_service(sidecar, settings) as live:
        live.approve()
        yield live


# --- the HTTP API ---------------------------------------------------------------------------


def test_1500_turns_through_the_http_api_with_if_match(service: LiveService) -> None:
    service.approve()
    window = service.settings.max_turns_kept
    assert window == 256
    history: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    etag = None
    sizes = [window + 2, 2, 1, 7, 2, 30, 2, 64, window + 2, 3]
    writes = 0
    while len(history) < 1500:
        added = new_turns(len(history), min(sizes[writes % len(sizes)], 1500 - len(history)))
        answer = put(service, kept + added, etag)
        assert answer.status_code in (200, 201), answer.text
        history += added
        writes += 1
        record = answer.json()["record"]
        summary = record["compacted_turns"]
        assert record["schema"] == "sessionstate.record.v2"
        assert len(record["turns"]) <= window
        assert summary["count"] + len(record["turns"]) == len(history)
        assert record["turns"] == history[summary["count"] :]
        assert summary["digest"] == chain(history[: summary["count"]])
        assert summary["token_estimate"] == sum(
            t["token_estimate"] for t in history[: summary["count"]]
        )
        kept, etag = record["turns"], answer.headers["ETag"]
    record, read_etag = stored(service)
    assert read_etag == etag
    assert len(record["turns"]) == window
    assert record["compacted_turns"]["count"] == 1500 - window
    assert record["compacted_turns"]["digest"] == chain(history[: 1500 - window])
    replay = service.call(
        "POST", service.session_path() + "/replay-preview", service.token(), json={}
    ).json()["preview"]
    assert replay["history"] == {
        "kept_turns": window,
        "kept_token_estimate": sum(t["token_estimate"] for t in history[-window:]),
        "compacted_turns": 1500 - window,
        "compacted_token_estimate": record["compacted_turns"]["token_estimate"],
        "compacted_digest": record["compacted_turns"]["digest"],
    }


def test_two_writers_racing_at_the_window_edge_one_wins_and_none_double_counts(
    windowed: LiveService,
) -> None:
    first = put(windowed, new_turns(0, WINDOW), None)
    assert first.status_code == 201
    base, etag = first.json()["record"]["turns"], first.headers["ETag"]
    barrier = threading.Barrier(2)
    answers: dict[str, requests.Response] = {}

    def write(name: str, start: int) -> None:
        with requests.Session() as http:
            barrier.wait()
            answers[name] = http.put(
                windowed.url + windowed.session_path() + "/state",
                json=state_input(turns=base + new_turns(start, 2)),
                headers={"If-Match": etag, "Authorization": f"Bearer {windowed.token()}"},
                timeout=10,
            )

    threads = [threading.Thread(target=write, args=args) for args in (("a", 100), ("b", 200))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(answer.status_code for answer in answers.values())
    assert statuses == [200, 412]
    (winner,) = [name for name, answer in answers.items() if answer.status_code == 200]
    record, _ = stored(windowed)
    history = new_turns(0, WINDOW) + new_turns(100 if winner == "a" else 200, 2)
    assert record["compacted_turns"]["count"] == 2
    assert record["compacted_turns"]["digest"] == chain(history[:2])
    assert record["turns"] == history[2:]


def test_an_unconditional_write_extends_the_summary_of_what_is_stored(
    windowed: LiveService,
) -> None:
    assert put(windowed, new_turns(0, WINDOW + 4), None).status_code == 201
    record, _ = stored(windowed)
    unconditional = windowed.call(
        "PUT",
        windowed.session_path() + "/state",
        windowed.token(),
        json=state_input(turns=record["turns"] + new_turns(WINDOW + 4, 2)),
    )
    assert unconditional.status_code == 200, unconditional.text
    summary = unconditional.json()["record"]["compacted_turns"]
    assert summary["count"] == 6 and summary["digest"] == chain(new_turns(0, 6))


def test_a_preview_shows_the_summary_the_write_stores(windowed: LiveService) -> None:
    assert put(windowed, new_turns(0, WINDOW + 1), None).status_code == 201
    record, etag = stored(windowed)
    body = state_input(turns=record["turns"] + new_turns(WINDOW + 1, 3))
    path = windowed.session_path() + "/state"
    previewed = windowed.call("POST", path + "/preview", windowed.token(), json=body).json()
    written = windowed.call("PUT", path, windowed.token(), json=body, headers={"If-Match": etag})
    assert previewed["record"]["compacted_turns"]["count"] == 4
    assert written.headers["ETag"] == f'"{previewed["record"]["state_digest"]}"'


def test_a_client_never_sends_a_summary(windowed: LiveService) -> None:
    forged = {"count": 0, "token_estimate": 0, "digest": "sha256:" + "0" * 64}
    answer = put(windowed, new_turns(0, 2), None, compacted_turns=forged)
    assert answer.status_code == 422
    assert answer.json()["errors"] == [{"loc": ["(unknown member)"], "rule": "extra_forbidden"}]
    assert "compacted_turns" not in answer.text


# --- v1 records ---------------------------------------------------------------------------


def test_a_v1_record_reads_as_it_is_and_its_first_write_is_v2(windowed: LiveService) -> None:
    key = DigestKey(DIGEST_KEY.encode())
    v1_turns = new_turns(0, 1024)  # a session the 1,024-turn cap had stopped
    stored_bytes, digest = v1_record_bytes(key, turns=v1_turns)
    windowed.context.lanes.put(state_key(SCOPE), stored_bytes)
    answer = windowed.call("GET", windowed.session_path() + "/state", windowed.token())
    assert answer.status_code == 200
    assert answer.headers["ETag"] == f'"{digest}"'
    record = answer.json()["read_report"]["record"]
    assert record["schema"] == "sessionstate.record.v1"
    assert "compacted_turns" not in record
    assert record["state_digest"] == digest and len(record["turns"]) == 1024
    replay = windowed.call(
        "POST", windowed.session_path() + "/replay-preview", windowed.token(), json={}
    ).json()["preview"]
    assert (replay["history"]["kept_turns"], replay["history"]["compacted_turns"]) == (1024, 0)
    written = put(windowed, v1_turns + new_turns(1024, 2), f'"{digest}"')
    assert written.status_code == 200, written.text
    v2 = written.json()["record"]
    assert v2["schema"] == "sessionstate.record.v2"
    assert v2["compacted_turns"]["count"] == 1026 - WINDOW
    assert v2["compacted_turns"]["digest"] == chain(v1_turns[: 1026 - WINDOW])
    assert v2["turns"] == (v1_turns + new_turns(1024, 2))[-WINDOW:]


def test_a_small_v1_record_becomes_v2_with_an_empty_summary(service: LiveService) -> None:
    service.approve()
    stored_bytes, digest = v1_record_bytes(DigestKey(DIGEST_KEY.encode()))
    service.context.lanes.put(state_key(SCOPE), stored_bytes)
    written = put(service, [], f'"{digest}"')
    assert written.status_code == 200
    assert written.json()["record"]["compacted_turns"]["count"] == 0


# --- the Python client --------------------------------------------------------------------


class SpyTransport(httpx.HTTPTransport):
    """The real transport, keeping every request body it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, bytes]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.read()))
        return super().handle_request(request)


def template() -> SessionStateInput:
    return SessionStateInput.model_validate(state_input(turns=[]))


def as_dicts(record: SessionStateRecord) -> list[dict[str, Any]]:
    return [turn.model_dump(mode="json") for turn in record.turns]


def test_the_five_steps_over_a_session_longer_than_the_window(windowed: LiveService) -> None:
    spy = SpyTransport()
    history: list[dict[str, Any]] = []
    with SessionStateClient(windowed.url, windowed.token(), transport=spy) as client:
        session = ModelServiceSession(client, SCOPE, template(), digest_key=TURN_KEY)
        for exchange in range(30):
            session.load()  # 1.
            preview = session.replay(max_inputs=4)  # 2.
            assert preview.allowed is True
            request = session.runtime_request(f"prompt {exchange}", preview)  # 3.
            assert request.history_turns == 2 * exchange
            assert request.compacted_turns == max(0, 2 * exchange - WINDOW)
            if exchange:
                assert preview.history is not None
                assert preview.history.kept_turns + preview.history.compacted_turns == 2 * exchange
            turns = [session.turn("user", request.prompt), session.turn("assistant", "echo")]
            result = session.commit_turns(turns)  # 4.
            assert result.applied is True and result.attempts == 1
            history += [turn.model_dump(exclude_none=True) for turn in turns]
            assert len(session.state.turns) <= WINDOW
        record = client.get_state(SCOPE).read_report.record
    assert record is not None and len(record.turns) == WINDOW
    assert record.summary.count == 60 - WINDOW
    assert record.summary.digest == chain(history[: 60 - WINDOW])
    assert session.compacted == record.summary
    puts = [json.loads(body) for method, body in spy.sent if method == "PUT"]
    assert len(puts) == 30
    assert max(len(body["turns"]) for body in puts) == WINDOW + 2  # the window and what is new


def test_a_conflict_after_the_other_writer_compacted_turns_we_hold(windowed: LiveService) -> None:
    with (
        SessionStateClient(windowed.url, windowed.token()) as one,
        SessionStateClient(windowed.url, windowed.token()) as two,
    ):
        mine = ModelServiceSession(one, SCOPE, template(), digest_key=TURN_KEY)
        theirs = ModelServiceSession(two, SCOPE, template(), digest_key=TURN_KEY)
        opening = [mine.turn("user", f"opening {n}") for n in range(WINDOW)]
        mine.commit_turns(opening)
        theirs.load()
        later = []
        for n in range(5):  # compacts 10 of the turns `mine` still holds
            batch = [theirs.turn("user", f"theirs {n}"), theirs.turn("assistant", "ok")]
            theirs.commit_turns(batch)
            later += batch
        last = [mine.turn("user", "mine, late"), mine.turn("assistant", "ok")]
        result = mine.commit_turns(last)
    assert result.applied is True and result.attempts == 2
    history = [turn.model_dump(exclude_none=True) for turn in opening + later + last]
    summary = result.record.summary
    assert summary.count + len(result.record.turns) == len(history) == WINDOW + 12
    assert summary.digest == chain(history[: summary.count])
    assert as_dicts(result.record) == history[summary.count :]


def test_writers_racing_across_the_window_edge_lose_no_turn(windowed: LiveService) -> None:
    with SessionStateClient(windowed.url, windowed.token()) as client:
        opening = ModelServiceSession(client, SCOPE, template(), digest_key=TURN_KEY)
        opening.commit_turns([opening.turn("user", f"opening {n}") for n in range(WINDOW - 2)])
    writers, exchanges = 2, 12
    loaded = threading.Barrier(writers)
    results: dict[str, list[SessionStateRecord]] = {}
    mine: dict[str, list[str]] = {}
    conflicts: list[int] = []
    errors: list[BaseException] = []

    def chat(name: str) -> None:
        try:
            with SessionStateClient(windowed.url, windowed.token()) as own:
                session = ModelServiceSession(
                    own, SCOPE, template(), digest_key=TURN_KEY, max_attempts=100
                )
                session.load()
                loaded.wait()
                results[name], mine[name] = [], []
                for n in range(exchanges):
                    turns = [session.turn("user", f"{name} {n}"), session.turn("assistant", "ok")]
                    result = session.commit_turns(turns)
                    assert result.applied is True
                    conflicts.append(result.attempts - 1)
                    results[name].append(result.record)
                    mine[name] += [turn.turn_id for turn in turns]
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=chat, args=(f"w{n}",)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(conflicts) >= 1  # both held one version: one of the first writes was a 412
    with SessionStateClient(windowed.url, windowed.token()) as client:
        final = client.get_state(SCOPE).read_report.record
    assert final is not None
    total = WINDOW - 2 + writers * exchanges * 2
    assert final.summary.count + len(final.turns) == total
    # Every version written extends the one before it; walked in order they give the history.
    versions = sorted(
        (record for records in results.values() for record in records),
        key=lambda record: record.summary.count + len(record.turns),
    )
    history: list[dict[str, Any]] = []
    for record in versions:
        known = {turn["turn_id"] for turn in history}
        history += [turn for turn in as_dicts(record) if turn["turn_id"] not in known]
    ids = [turn["turn_id"] for turn in history]
    assert versions[0].summary.count == 0 and versions[-1] == final
    assert len(ids) == len(set(ids)) == total  # every turn once, none lost
    for name, turn_ids in mine.items():  # each writer's turns in its own order
        assert [turn_id for turn_id in ids if turn_id in set(turn_ids)] == turn_ids, name
    assert final.summary.digest == chain(history[: final.summary.count])
    assert as_dicts(final) == history[final.summary.count :]


def test_a_long_preview_only_chat_holds_at_most_the_window(
    sidecar: OpaSidecar, tmp_path: Path
) -> None:
    settings = service_settings(tmp_path / "var", max_turns_kept=WINDOW, durable_writes=False)
    with (
        live_service(sidecar, settings) as live,
        SessionStateClient(live.url, live.token()) as client,
    ):
        session = ModelServiceSession(client, SCOPE, template(), digest_key=TURN_KEY)
        for n in range(WINDOW):
            result = session.commit_turns(
                [session.turn("user", f"q {n}"), session.turn("assistant", "a")]
            )
            assert result.applied is False
            assert len(session.state.turns) == min(2 * (n + 1), WINDOW)
            assert session.replay().allowed is True
    assert result.record.summary.count == 2  # the preview's: what that write would compact


class LosingAnswers(httpx.HTTPTransport):
    """Sends every request; for the first PUT, runs `meanwhile` and then loses the answer."""

    def __init__(self, meanwhile: Callable[[], None]) -> None:
        super().__init__()
        self.meanwhile = meanwhile
        self.lost = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "PUT" and not self.lost:
            self.lost = True
            response.read()
            self.meanwhile()
            raise httpx.ReadError("connection reset", request=request)
        return response


def test_a_lost_answer_is_never_written_twice(windowed: LiveService) -> None:
    transport = LosingAnswers(lambda: None)
    with SessionStateClient(windowed.url, windowed.token(), transport=transport) as client:
        session = ModelServiceSession(client, SCOPE, template(), digest_key=TURN_KEY)
        turns = [session.turn("user", f"turn {n}") for n in range(WINDOW + 2)]
        result = session.commit_turns(turns)  # lands, answer lost, 412 on the retry, re-read
    assert transport.lost and result.attempts == 2
    summary = result.record.summary
    assert summary.count + len(result.record.turns) == WINDOW + 2
    assert summary.digest == chain([turn.model_dump(exclude_none=True) for turn in turns[:2]])


def test_a_lost_answer_whose_turns_were_compacted_since_is_raised(windowed: LiveService) -> None:
    other = SessionStateClient(windowed.url, windowed.token())

    def another_writer_fills_the_window() -> None:
        theirs = ModelServiceSession(other, SCOPE, template(), digest_key=TURN_KEY)
        theirs.load()
        theirs.commit_turns([theirs.turn("user", f"theirs {n}") for n in range(WINDOW)])

    transport = LosingAnswers(another_writer_fills_the_window)
    with other, SessionStateClient(windowed.url, windowed.token(), transport=transport) as client:
        session = ModelServiceSession(client, SCOPE, template(), digest_key=TURN_KEY)
        turns = [session.turn("user", "mine 0"), session.turn("assistant", "mine 1")]
        with pytest.raises(PreconditionFailed):
            session.commit_turns(turns)  # cannot tell whether they were stored: not resent
        record = client.get_state(SCOPE).read_report.record
    assert record is not None
    assert record.summary.count + len(record.turns) == 2 + WINDOW  # each turn once
