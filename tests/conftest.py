from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from store.digests import DigestKey
from store.lanes import LaneStore
from store.session_state import SessionStateStore

settings.register_profile(
    "sessionstate",
    deadline=None,
    max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "150")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("sessionstate")


@pytest.fixture
def digest_key() -> DigestKey:
    return DigestKey(b"k" * 32)


@pytest.fixture
def lanes(tmp_path: Path) -> Iterator[LaneStore]:
    store = LaneStore(tmp_path / "leveldb")
    yield store
    store.close()


@pytest.fixture
def state_store(lanes: LaneStore) -> SessionStateStore:
    return SessionStateStore(lanes)
