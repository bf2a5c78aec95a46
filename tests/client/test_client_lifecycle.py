"""The Python client's session lifecycle calls against the live service: a workspace's list,
a session's erasure and a workspace's, sync and async."""

from __future__ import annotations

import asyncio

import pytest
from sessionstate_client import (
    AsyncSessionStateClient,
    NotFound,
    PolicyDenied,
    PreconditionFailed,
    SessionStateClient,
    SessionStateInput,
)
from sessionstate_client.models import TenantScope

from tests.support.factories import state_input
from tests.support.live import LiveService

SESSIONS = ("chat-1", "chat-2", "chat-3")


def scope_of(session: str) -> TenantScope:
    return TenantScope(tenant_id="tenant-a", workspace_id="ws-1", session_id=session)


@pytest.fixture
def written(service: LiveService) -> LiveService:
    service.approve()
    for session in SESSIONS:
        with SessionStateClient(service.url, service.token(session=session)) as client:
            client.put_state(scope_of(session), SessionStateInput.model_validate(state_input()))
    return service


def test_list_a_page_at_a_time_then_erase(written: LiveService) -> None:
    with SessionStateClient(written.url, written.token(session=None)) as workspace:
        first = workspace.list_sessions("tenant-a", "ws-1", limit=2)
        assert [item.session_id for item in first.sessions] == ["chat-1", "chat-2"]
        assert first.decision.action == "list"
        rest = workspace.list_sessions("tenant-a", "ws-1", cursor=first.next_cursor)
        assert [item.session_id for item in rest.sessions] == ["chat-3"]
        assert rest.next_cursor is None
    with SessionStateClient(written.url, written.token()) as session:
        with pytest.raises(PolicyDenied) as refused:
            session.list_sessions("tenant-a", "ws-1")
        assert refused.value.reason == "cross_session_scope_rejected"
        with pytest.raises(PreconditionFailed):
            session.erase(scope_of("chat-1"), if_match="sha256:" + "0" * 64)
        digest = first.sessions[0].state_digest
        assert digest is not None
        decision_id = session.erase(scope_of("chat-1"), if_match=digest)
        with pytest.raises(NotFound) as gone:
            session.get_state(scope_of("chat-1"))
    assert gone.value.reason == "session_state_erased"
    assert gone.value.problem is not None
    assert gone.value.problem.erasure_decision_id == decision_id
    with SessionStateClient(written.url, written.operator()) as operator:
        erased = operator.erase_workspace("tenant-a", "ws-1")
        assert (erased.sessions_erased, erased.complete) == (2, True)
        assert operator.list_sessions("tenant-a", "ws-1").sessions == []


def test_the_async_client_lists_and_erases(written: LiveService) -> None:
    async def run() -> None:
        async with AsyncSessionStateClient(written.url, written.token(session=None)) as client:
            listed = await client.list_sessions("tenant-a", "ws-1", limit=1)
            assert [item.session_id for item in listed.sessions] == ["chat-1"]
            assert listed.next_cursor is not None
        async with AsyncSessionStateClient(written.url, written.token()) as client:
            decision_id = await client.erase(scope_of("chat-1"))
            assert decision_id
            assert await client.erase(scope_of("chat-1"))  # nothing left: 204 all the same
        async with AsyncSessionStateClient(written.url, written.operator()) as client:
            erased = await client.erase_workspace("tenant-a", "ws-1")
            assert erased.sessions_erased == 2

    asyncio.run(run())
