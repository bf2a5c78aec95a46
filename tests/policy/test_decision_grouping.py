"""Grouped decisions (service.policy.grouping) through the real, locked-down OPA sidecar."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.policy.batch import LIVE_BATCH_PACKAGE
from service.policy.client import PolicyClient
from service.policy.grouping import DecisionGroups
from service.policy.input import PolicyInput
from service.policy.sidecar import OpaSidecar
from service.policy.trace import DecisionTrace
from tests.support.policy_inputs import SCOPE, allowed_input

DENIED = allowed_input(
    "read", actor={"sub": "s", "roles": ["model-service"], **SCOPE, "tenant_id": "tenant-b"}
)


@pytest.fixture
def grouped(sidecar: OpaSidecar) -> Iterator[PolicyClient]:
    client = PolicyClient(
        sidecar.url, sidecar.token, timeout=2.0, transport="keep-alive", grouped=True
    )
    yield client
    client.close()


def at_once(decide: Callable[[PolicyInput], DecisionTrace], inputs: list[PolicyInput]) -> list[Any]:
    """Each input decided in a thread of its own, all started together; traces in order."""
    traces: list[Any] = [None] * len(inputs)
    start = threading.Barrier(len(inputs))

    def one(index: int) -> None:
        start.wait()
        traces[index] = decide(inputs[index])

    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return traces


def test_a_decision_alone_is_asked_alone(grouped: PolicyClient) -> None:
    trace = grouped.decide(allowed_input("read"))
    assert trace.allow and trace.batch is None
    assert "." not in trace.decision_id


def test_concurrent_decisions_share_queries_and_each_is_its_own(grouped: PolicyClient) -> None:
    assert grouped.groups is not None
    inputs = [allowed_input("read") if i % 2 else DENIED for i in range(16)] * 4
    traces: list[DecisionTrace] = []
    for round_ in range(0, len(inputs), 16):
        traces += at_once(grouped.decide, inputs[round_ : round_ + 16])
    assert grouped.groups.batches > 0
    for policy_input, trace in zip(inputs, traces, strict=True):
        expected = policy_input is not DENIED
        assert trace.allow is expected
        assert trace.reasons == ([] if expected else ["cross_tenant_scope_rejected"])
        assert trace.policy == "sessionstate/read" and trace.policy_revision != "unknown"
    batched = [trace for trace in traces if trace.batch is not None]
    assert batched
    for trace in batched:
        assert trace.batch is not None
        assert trace.decision_id == f"{trace.batch.decision_id}.{trace.batch.index}"
        assert 0 <= trace.batch.index < trace.batch.size
    assert len({trace.decision_id for trace in traces}) == len(traces)  # each its own id
    queries: dict[str, set[int]] = {}
    for trace in batched:
        assert trace.batch is not None
        queries.setdefault(trace.batch.decision_id, set()).add(trace.batch.index)
    for query_id, indexes in queries.items():
        sizes = {t.batch.size for t in batched if t.batch and t.batch.decision_id == query_id}
        assert len(sizes) == 1 and indexes == set(range(sizes.pop()))


def test_each_batch_item_is_in_opa_s_own_log_under_the_query_s_id(
    grouped: PolicyClient, sidecar: OpaSidecar
) -> None:
    traces = at_once(grouped.decide, [allowed_input("read")] * 12)
    batched = [trace for trace in traces if trace.batch is not None]
    assert batched
    logged = Path(sidecar.log_path).read_text()
    for trace in batched:
        assert f'"decision_id":"{trace.batch.decision_id}"' in logged


def test_a_failing_query_denies_every_item(sidecar: OpaSidecar) -> None:
    dead = PolicyClient(
        "http://127.0.0.1:9", sidecar.token, timeout=0.5, transport="keep-alive", grouped=True
    )
    try:
        traces = at_once(dead.decide, [allowed_input("read")] * 8)
    finally:
        dead.close()
    assert all(not trace.allow and trace.engine_unavailable for trace in traces)
    assert all(trace.batch is None for trace in traces)


def test_an_undefined_item_denies_only_itself() -> None:
    """OPA's batch result without an item: that item alone is undefined."""
    asked: list[str] = []

    def query(package: str, encoded: bytes) -> Any:
        asked.append(package)
        if package != LIVE_BATCH_PACKAGE:
            return {"decision_id": "solo", "result": {"allow": True, "reasons": []}}
        return {"decision_id": "q", "result": {"0": {"allow": True, "reasons": []}}}

    groups = DecisionGroups(query)
    answers = _grouped_answers(groups, 3)
    decided = [answer.answer["result"] for answer in answers if hasattr(answer, "answer")]
    assert {"allow": True, "reasons": []} in decided and None in decided


def test_a_batch_opa_will_not_decide_is_asked_one_by_one() -> None:
    """Refused (an authorization policy without the batch) or without a result (no batch
    module): each item is asked alone, and the next decisions too, for a while."""
    for refusal in ("refused", {"decision_id": "q"}):
        asked: list[str] = []

        def query(
            package: str, encoded: bytes, refusal: Any = refusal, asked: list[str] = asked
        ) -> Any:
            asked.append(package)
            if package == LIVE_BATCH_PACKAGE:
                return refusal
            return {"decision_id": "solo", "result": {"allow": True, "reasons": []}}

        groups = DecisionGroups(query)
        answers = _grouped_answers(groups, 4)
        assert groups.fallbacks == 1
        assert all(answer["decision_id"] == "solo" for answer in answers)
        assert asked.count(LIVE_BATCH_PACKAGE) == 1
        before = len(asked)
        assert groups.ask("read", b"{}")["decision_id"] == "solo"
        assert asked[before:] == ["read"]  # no batch tried meanwhile


def _grouped_answers(groups: DecisionGroups, followers: int) -> list[Any]:
    """One decision in flight, `followers` asked meanwhile: they go in one batch."""
    release = threading.Event()
    original = groups._query

    def held(package: str, encoded: bytes) -> Any:
        if package != LIVE_BATCH_PACKAGE and not release.is_set():
            release.wait(5)  # the first query stays in flight while the others queue
        return original(package, encoded)

    groups._query = held
    answers: list[Any] = [None] * (followers + 1)

    def one(index: int) -> None:
        answers[index] = groups.ask("read", b'{"i":%d}' % index)

    first = threading.Thread(target=one, args=(0,))
    first.start()
    while not groups._in_flight:
        pass
    others = [threading.Thread(target=one, args=(i,)) for i in range(1, followers + 1)]
    for thread in others:
        thread.start()
    while len(groups._waiting) < followers:
        pass
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    return answers[1:]
