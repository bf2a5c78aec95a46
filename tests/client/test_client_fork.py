"""The Python client's fork against the live service: the client's `fork`, sync and async,
and `ModelServiceSession.fork`, for a bot's session and for one of a workspace's client."""

from __future__ import annotations

import asyncio

import pytest
from sessionstate_client import (
    AsyncModelServiceSession,
    AsyncSessionStateClient,
    Conflict,
    InvalidRequest,
    ModelServiceSession,
    PolicyDenied,
    SessionStateClient,
    SessionStateInput,
)
from sessionstate_client.models import TenantScope

from tests.support.factories import state_input
from tests.support.live import LiveService


def scope_of(session: str) -> TenantScope:
    return TenantScope(tenant_id="tenant-a", workspace_id="ws-1", session_id=session)


def nth(n: int) -> SessionStateInput:
    turns = [{"turn_id": f"turn-{n}", "role": "user", "payload": f"message {n}"}]
    return SessionStateInput.model_validate(state_input(turns=turns))


def three_versions(service: LiveService) -> list[str]:
    service.approve()
    with SessionStateClient(service.url, service.token()) as client:
        return [client.put_state(scope_of("chat-1"), nth(n)).record.state_digest for n in (1, 2, 3)]


def test_fork_a_version_then_the_target_exists(service: LiveService) -> None:
    digests = three_versions(service)
    with SessionStateClient(service.url, service.token(session=None)) as workspace:
        forked = workspace.fork(scope_of("chat-1"), "chat-2", from_version=2)
        assert forked.version == 1 and forked.decision.action == "fork"
        assert forked.record.scope == scope_of("chat-2")
        lineage = forked.record.lineage
        assert lineage is not None
        assert (lineage.forked_from.version, lineage.forked_from.state_digest) == (2, digests[1])
        with pytest.raises(Conflict) as exists:
            workspace.fork(scope_of("chat-1"), "chat-2")
        assert exists.value.reason == "session_state_exists"
        with pytest.raises(InvalidRequest) as bad:
            workspace.fork(scope_of("chat-1"), "Chat 3")
        assert bad.value.reason == "invalid_scope_id"
        with pytest.raises(ValueError, match="version"):
            workspace.fork(scope_of("chat-1"), "chat-3", from_version=0)
        listed = workspace.list_sessions("tenant-a", "ws-1").sessions
        assert [item.lineage is not None for item in listed] == [False, True]
    with SessionStateClient(service.url, service.token()) as session:
        with pytest.raises(PolicyDenied) as refused:
            session.fork(scope_of("chat-1"), "chat-3")
        assert refused.value.reason == "session_scoped_token_rejected"
        own = ModelServiceSession(session, scope_of("chat-1"), state_input())
        own.load()  # a session with its own session's token may not fork: refused, not hidden
        with pytest.raises(PolicyDenied):
            own.fork("chat-3")


def test_a_bot_s_session_forks_into_a_session_of_its_own(service: LiveService) -> None:
    three_versions(service)
    with SessionStateClient(service.url, None) as client:
        bot = service.token(sub="bot-1", session=None)
        session = ModelServiceSession.for_service(client, bot, scope_of("chat-1"), state_input())
        session.load()
        branch = session.fork("chat-2", from_version=1)
        assert branch.scope == scope_of("chat-2")
        assert branch.last_decision is not None and branch.last_decision.action == "fork"
        assert [turn.turn_id for turn in branch.state.turns] == ["turn-1"]
        result = branch.commit_turns([branch.turn("user", "a branch of its own")])
        assert result.applied, result.blocked_reasons  # with chat-2's own session token
        stored = client.with_token(service.token(session="chat-2")).get_state(scope_of("chat-2"))
        assert stored.version == 2
        record = stored.read_report.record
        assert record is not None and record.turns[0].turn_id == "turn-1"


def test_the_async_client_and_session_fork(service: LiveService) -> None:
    three_versions(service)

    async def run() -> None:
        async with AsyncSessionStateClient(service.url, service.token(session=None)) as client:
            forked = await client.fork(scope_of("chat-1"), "chat-2")
            assert forked.record.lineage is not None
            assert forked.record.lineage.forked_from.version == 3
            bot = service.token(sub="bot-1", session=None)
            session = AsyncModelServiceSession.for_service(
                client, bot, scope_of("chat-1"), state_input()
            )
            await session.load()
            branch = await session.fork("chat-3", 2)
            assert branch.scope == scope_of("chat-3") and branch.version is not None
            result = await branch.commit_turns([branch.turn("user", "on the branch")])
            assert result.applied, result.blocked_reasons

    asyncio.run(run())
