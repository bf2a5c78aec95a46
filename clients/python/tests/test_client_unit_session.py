"""`ModelServiceSession`'s steps against a small fake store that answers as the contract says.

The session reads the record (or starts from its template), plans or asks for
the replay preview, builds the runtime request locally, and writes its turns
under `If-None-Match: *` or `If-Match` with the version it holds. On a 412 it
re-reads and merges by turn id; on a denial it previews instead and holds the
turns, as digests, for the next allowed write. The async session makes the
same requests, step for step.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from conftest import SCOPE, FakeStore, sanitized, sha256, template
from sessionstate_client import (
    AsyncModelServiceSession,
    CorruptState,
    DigestKey,
    ModelServiceSession,
    PreconditionFailed,
    SessionStateInput,
    SessionTurnInput,
    estimate_tokens,
)
from sessionstate_client.models import SessionStateRecord
from sessionstate_client.replay import plan_replay

CANARY = "TURN-TEXT-CANARY-77aa"


def turn(turn_id: str, text: str = "hello", role: str = "user") -> SessionTurnInput:
    return SessionTurnInput.model_validate({"turn_id": turn_id, "role": role, "payload": text})


def session_of(store: FakeStore, **options: Any) -> ModelServiceSession:
    return ModelServiceSession(store.sync_client(), SCOPE, template(), **options)


def test_a_new_session_starts_from_its_template(store: FakeStore) -> None:
    session = session_of(store)
    assert session.load() == SessionStateInput.model_validate(template())
    assert session.version is None and session.compacted.count == 0
    assert session.last_decision is None  # a 404 carries no decision of a read held
    assert store.paths() == ["GET /state"]


def test_the_first_write_creates_and_the_next_replaces_the_version_held(store: FakeStore) -> None:
    session = session_of(store)
    first = session.commit_turns([turn("t1", CANARY)])
    assert (first.applied, first.attempts) == (True, 1)
    assert session.version == first.state_digest == store.record["state_digest"]  # type: ignore[index]
    second = session.commit_turns([turn("t2", "again")])
    assert second.applied is True
    creating, replacing = store.requests
    assert creating.headers["If-None-Match"] == "*" and "If-Match" not in creating.headers
    assert replacing.headers["If-Match"] == f'"{first.state_digest}"'
    sent = json.loads(replacing.content)["turns"]
    assert sent[0] == {
        "turn_id": "t1",
        "role": "user",
        "payload_digest": sha256(CANARY),
        "token_estimate": len(CANARY) // 4,
    }  # a stored turn goes back as its digest, never its text again
    assert sent[1]["payload"] == "again"
    assert CANARY.encode() not in replacing.content


def test_load_adopts_the_stored_record_as_digests_under_the_configured_profile(
    store: FakeStore,
) -> None:
    store.store(template(turns=[{"turn_id": "t1", "role": "user", "payload": CANARY}]))
    session = session_of(store)
    state = session.load()
    assert session.version == store.record["state_digest"]  # type: ignore[index]
    assert [(t.turn_id, t.payload, t.payload_digest) for t in state.turns] == [
        ("t1", None, sha256(CANARY))
    ]
    assert state.runtime_profile.cancellation_anchor == "stop if the user says cancel"
    assert state.memory_anchors[0].evidence is None  # anchors are held as digests too
    assert session.last_decision is not None and session.last_decision.action == "read"


def test_a_replay_with_nothing_stored_is_planned_from_a_preview_of_the_state_held(
    store: FakeStore,
) -> None:
    session = session_of(store)
    session.load()
    preview = session.replay(max_inputs=1)
    assert store.paths() == ["GET /state", "POST /state/preview"]
    record = SessionStateRecord.model_validate(sanitized(json.loads(store.requests[-1].content)))
    assert preview == plan_replay(record, 1)
    assert [item.kind for item in preview.routing_inputs] == ["runtime_profile"]
    assert len(preview.retrieval_inputs) == 1  # memory and retrieval, capped at one


def test_a_replay_of_a_stored_record_is_the_services(store: FakeStore) -> None:
    store.store(template())
    session = session_of(store)
    session.load()
    preview = session.replay(4)
    assert store.paths() == ["GET /state", "POST /replay-preview"]
    assert json.loads(store.requests[-1].content) == {"max_inputs": 4}
    assert preview.evidence_digest == sha256("served replay")
    assert session.last_decision is not None and session.last_decision.action == "replay"


def test_a_record_gone_under_a_replay_starts_over_as_a_load_does(store: FakeStore) -> None:
    session = session_of(store)
    session.commit_turns([turn("t1")])
    store.record = None  # the store was reset under the session
    assert session.replay().allowed is True
    assert store.paths()[-2:] == ["POST /replay-preview", "POST /state/preview"]
    assert session.version is None and session.state.turns == []
    result = session.commit_turns([turn("t2")])
    assert result.attempts == 1 and store.requests[-1].headers["If-None-Match"] == "*"


def test_a_conflicting_writer_is_re_read_and_merged_by_turn_id(store: FakeStore) -> None:
    session = session_of(store)
    session.load()
    store.store(template(turns=[{"turn_id": "theirs", "role": "user", "payload": "x"}]))
    result = session.commit_turns([turn("mine")])
    assert (result.applied, result.attempts) == (True, 2)
    assert store.paths() == ["GET /state", "PUT /state", "GET /state", "PUT /state"]
    assert [t.turn_id for t in result.record.turns] == ["theirs", "mine"]


def test_conflicts_past_the_attempt_budget_raise(store: FakeStore) -> None:
    session = session_of(store, max_attempts=1)
    session.load()
    store.store(template())
    with pytest.raises(PreconditionFailed) as conflict:
        session.commit_turns([turn("late")])
    assert conflict.value.write_report is not None
    assert conflict.value.write_report.blocked_reasons == ["precondition_failed"]
    assert store.paths() == ["GET /state", "PUT /state"]


def test_a_session_needs_at_least_one_attempt(store: FakeStore) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        session_of(store, max_attempts=0)


def test_a_denied_write_is_previewed_and_its_turns_written_once_allowed() -> None:
    store = FakeStore(writes_allowed=False)
    session = session_of(store)
    first = session.commit_turns([turn("t1", CANARY)])
    assert first.applied is False and first.attempts == 1
    assert first.blocked_reasons == ["session_state_operator_approval_missing"]
    assert first.decision.allow is False and first.write_report.applied is False
    assert store.paths() == ["PUT /state", "POST /state/preview"]
    held = session.state.turns
    assert [(t.turn_id, t.payload, t.payload_digest) for t in held] == [
        ("t1", None, sha256(CANARY))
    ]
    store.writes_allowed = True
    second = session.commit_turns([turn("t2")])
    assert second.applied is True
    assert [t.turn_id for t in second.record.turns] == ["t1", "t2"]
    assert CANARY.encode() not in store.requests[-1].content  # held turns go as digests


def test_a_corrupt_record_is_raised_unless_asked_to_replace_it(store: FakeStore) -> None:
    store.corrupt_digest = sha256("unreadable bytes")
    with pytest.raises(CorruptState) as corrupt:
        session_of(store).load()
    assert corrupt.value.reason == "session_state_schema_mismatch"
    assert corrupt.value.read_report.error_digest == store.corrupt_digest
    session = session_of(store, replace_corrupt=True)
    session.load()
    assert session.version == store.corrupt_digest
    result = session.commit_turns([turn("fresh")])
    assert result.applied is True
    assert store.requests[-1].headers["If-Match"] == f'"{sha256("unreadable bytes")}"'


def test_a_digest_key_keeps_the_turn_text_in_the_process(store: FakeStore) -> None:
    key = DigestKey(b"model-service-own-key-0123456789", key_id="svc")
    session = session_of(store, digest_key=key)
    made = session.turn("assistant", CANARY)
    assert made.payload is None and made.role == "assistant"
    assert made.payload_digest == key.digest_text(CANARY)
    assert made.token_estimate == estimate_tokens(CANARY)
    session.commit_turns([made])
    assert all(CANARY.encode() not in request.content for request in store.requests)


def test_without_a_digest_key_the_text_goes_to_the_service_to_digest(store: FakeStore) -> None:
    session = session_of(store)
    made, other = session.turn("user", CANARY), session.turn("user", CANARY)
    assert made.payload == CANARY and made.payload_digest is None
    assert made.turn_id.startswith("turn-") and made.turn_id != other.turn_id


def test_a_long_session_sends_its_window_and_counts_what_was_compacted() -> None:
    store = FakeStore(window=2)
    session = session_of(store)
    result = session.commit_turns([turn("t1", "a" * 40), turn("t2", "b" * 8), turn("t3", "c" * 4)])
    assert [t.turn_id for t in result.record.turns] == ["t2", "t3"]
    assert session.compacted.count == 1
    request = session.runtime_request(CANARY, session.replay())
    assert (request.history_turns, request.compacted_turns) == (3, 1)
    assert request.history_token_estimate == 7 + 2 + 1  # the fake's estimate of t1, then t2, t3
    assert request.prompt == CANARY and CANARY not in repr(request)
    assert "cancellation_anchor" not in request.runtime_profile.model_dump()
    session.commit_turns([turn("t4")])
    assert [t["turn_id"] for t in json.loads(store.requests[-1].content)["turns"]] == [
        "t2",
        "t3",
        "t4",
    ]  # the window and what is new, never the whole history


class AnswerLost(FakeStore):
    """Writes the first PUT, then lets `then` write over it, then drops the answer."""

    def __init__(self, then: dict[str, Any] | None) -> None:
        super().__init__(window=1)
        self.then = then
        self.dropped = False

    def answer(self, request: httpx.Request) -> httpx.Response:
        answer = super().answer(request)
        if request.method == "PUT" and not self.dropped:
            self.dropped = True
            if self.then is not None:
                self.store(self.then)
            raise httpx.ReadError("the answer was lost")
        return answer


def test_a_write_whose_answer_was_lost_is_not_sent_twice() -> None:
    store = AnswerLost(then=None)
    session = session_of(store)
    result = session.commit_turns([turn("mine")])
    assert result.applied is True and [t.turn_id for t in result.record.turns] == ["mine"]
    assert store.paths() == ["PUT /state", "PUT /state", "GET /state", "PUT /state"]
    assert json.loads(store.requests[-1].content)["turns"] == [
        {"turn_id": "mine", "role": "user", "payload_digest": sha256("hello"), "token_estimate": 1}
    ]


def test_a_lost_answer_whose_turns_were_compacted_since_raises_the_conflict() -> None:
    # Another writer read our landed write and wrote over it: with a window of one turn,
    # ours is compacted away, so the session cannot tell whether it is stored.
    seen_by_them = [
        {"turn_id": "mine", "role": "user", "payload": "hello"},
        {"turn_id": "theirs", "role": "user", "payload": "x"},
    ]
    store = AnswerLost(then=template(turns=seen_by_them))
    session = session_of(store)
    with pytest.raises(PreconditionFailed) as conflict:
        session.commit_turns([turn("mine")])
    assert conflict.value.attempts == 2  # the retried PUT: the first may have landed
    assert store.paths() == ["PUT /state", "PUT /state", "GET /state"]


def conversation_requests(flavour: str) -> list[tuple[str, str, Any, str | None, str | None]]:
    """One conversation (denied, allowed, in conflict) with either session, as sent."""
    store = FakeStore(writes_allowed=False)
    if flavour == "sync":
        sync = session_of(store)
        sync.load()
        sync.replay()
        sync.commit_turns([turn("t1")])
        store.writes_allowed = True
        sync.commit_turns([turn("t2")])
        store.store(template(turns=[{"turn_id": "other", "role": "user", "payload": "x"}]))
        sync.commit_turns([turn("t3")])
        sync.replay(2)
    else:

        async def run() -> None:
            session = AsyncModelServiceSession(store.async_client(), SCOPE, template())
            await session.load()
            await session.replay()
            await session.commit_turns([turn("t1")])
            store.writes_allowed = True
            await session.commit_turns([turn("t2")])
            store.store(template(turns=[{"turn_id": "other", "role": "user", "payload": "x"}]))
            await session.commit_turns([turn("t3")])
            await session.replay(2)

        asyncio.run(run())
    return [
        (
            r.method,
            r.url.path,
            json.loads(r.content) if r.content else None,
            r.headers.get("If-Match"),
            r.headers.get("If-None-Match"),
        )
        for r in store.requests
    ]


def test_the_async_session_sends_what_the_sync_session_sends() -> None:
    sent = conversation_requests("sync")
    assert conversation_requests("async") == sent
    assert len(sent) == 9  # read, preview, denied write, preview, write, 412, read, write, replay
