"""The Python client's versions, version reads and rewinds against the live service."""

from __future__ import annotations

import asyncio

import pytest
from sessionstate_client import (
    AsyncSessionStateClient,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    SessionStateClient,
    SessionStateInput,
)

from tests.support.factories import scope, state_input
from tests.support.live import LiveService

SCOPE = scope()


def nth(n: int) -> SessionStateInput:
    turns = [{"turn_id": f"turn-{n}", "role": "user", "payload": f"message {n}"}]
    return SessionStateInput.model_validate(state_input(turns=turns))


def test_versions_pages_a_read_of_one_and_a_rewind(service: LiveService) -> None:
    service.approve()
    with SessionStateClient(service.url, service.token()) as client:
        written = [client.put_state(SCOPE, nth(n)) for n in range(1, 4)]
        assert [answer.version for answer in written] == [1, 2, 3]
        first = client.versions(SCOPE, limit=2)
        assert [v.version for v in first.versions] == [3, 2]
        rest = client.versions(SCOPE, limit=2, cursor=first.next_cursor)
        assert [v.version for v in rest.versions] == [1] and rest.next_cursor is None
        old = client.read_version(SCOPE, 1)
        assert old.version == 1 and old.read_report.record == written[0].record
        with pytest.raises(NotFound) as missing:
            client.read_version(SCOPE, 9)
        assert missing.value.reason == "session_state_version_not_found"
        current = written[2].record.state_digest
        with pytest.raises(PreconditionFailed):
            client.rewind(SCOPE, 1, if_match=written[1].record.state_digest)
        rewound = client.rewind(SCOPE, 1, if_match=current)
        assert rewound.version == 4
        assert rewound.record.state_digest == written[0].record.state_digest
        assert client.get_state(SCOPE).version == 4
    with pytest.raises(ValueError, match="version"):
        SessionStateClient(service.url, service.token()).read_version(SCOPE, 0)


def test_a_rewind_without_if_match_is_an_invalid_request(service: LiveService) -> None:
    service.approve()
    with SessionStateClient(service.url, service.token()) as client:
        client.put_state(SCOPE, nth(1))
        with pytest.raises(InvalidRequest) as refused:
            client.rewind(SCOPE, 1, if_match="")
    assert refused.value.reason == "invalid_precondition"


def test_the_async_client_lists_reads_and_rewinds(service: LiveService) -> None:
    service.approve()

    async def run() -> None:
        async with AsyncSessionStateClient(service.url, service.token()) as client:
            one = await client.put_state(SCOPE, nth(1))
            two = await client.put_state(SCOPE, nth(2))
            listed = await client.versions(SCOPE)
            assert [v.version for v in listed.versions] == [2, 1]
            assert listed.versions[1].decision_id == one.decision.decision_id
            read = await client.read_version(SCOPE, 1)
            assert read.read_report.record == one.record
            rewound = await client.rewind(SCOPE, 1, if_match=two.record.state_digest)
            assert (rewound.version, rewound.record) == (3, one.record)

    asyncio.run(run())
