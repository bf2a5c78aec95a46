"""Properties of the sanitized record, checked with generated inputs."""

from __future__ import annotations

import json
import random

from hypothesis import given
from hypothesis import strategies as st

from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_digest, canonical_json
from store.digests import DigestKey
from store.key_codec import LaneKey
from store.record.state_record import SessionStateRecord
from store.session_state import SessionStateStore, state_key
from tests.support.factories import record, scope

KEY = DigestKey(b"p" * 32)
MARK = "RAWCANARY"

# Raw text of every shape, always carrying a marker that nothing else in a record contains.
raw_texts = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1000, max_size=5000),
    st.builds(json.dumps, st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4)),
    st.just("sha256:" + "ab" * 32),
    st.just("hmac-sha256:k1:" + "cd" * 32),
    st.just('"}],"raw_messages_stored":true,"x":"'),
).map(lambda text: MARK + text)


@given(payload=raw_texts, evidence=raw_texts, cancel=raw_texts)
def test_no_raw_text_ever_appears_in_the_record(payload: str, evidence: str, cancel: str) -> None:
    built = record(
        KEY,
        runtime_profile={
            "task_profile": "general",
            "model_id": "m",
            "tokenizer": "t",
            "context_window": 8,
            "max_tokens": 8,
            "streaming": False,
            "cancellation_anchor": cancel,
        },
        memory_anchors=[{"anchor_id": "memory:a", "evidence": evidence}],
        retrieval_evidence=[{"anchor_id": "doc:a", "evidence": evidence}],
        routing_evidence=[{"anchor_id": "route:a", "evidence": evidence}],
        turns=[{"turn_id": "t1", "role": "user", "payload": payload}],
    )
    stored = canonical_json(built.to_json()).decode("utf-8")
    for raw in (payload, evidence, cancel):
        assert raw not in stored
        assert raw not in json.dumps(built.to_json())
    assert MARK not in stored
    assert MARK not in repr(built)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


def shuffled(value: object, rng: random.Random) -> object:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


@given(value=json_values, seed=st.integers())
def test_canonical_digest_does_not_depend_on_key_order(value: object, seed: int) -> None:
    assert canonical_digest(shuffled(value, random.Random(seed))) == canonical_digest(value)


@given(seed=st.integers())
def test_state_digest_does_not_depend_on_key_order(seed: int) -> None:
    built = record(KEY)
    reordered = json.dumps(shuffled(built.to_json(), random.Random(seed)))
    parsed = SessionStateRecord.model_validate_json(reordered)
    assert parsed.computed_state_digest() == built.state_digest


def _stored_bytes(lanes: LevelDBLaneStore) -> tuple[LaneKey, bytes]:
    built = record(KEY)
    SessionStateStore(lanes).write(built)
    key = state_key(built.scope)
    stored = lanes.get(key)
    assert stored is not None
    return key, stored


def test_every_single_byte_change_reads_as_corrupt(lanes: LevelDBLaneStore) -> None:
    """Exhaustive over positions: each byte flipped in two ways."""
    store = SessionStateStore(lanes)
    key, stored = _stored_bytes(lanes)
    for position in range(len(stored)):
        for mask in (0x01, 0x20):
            changed = bytearray(stored)
            changed[position] ^= mask
            lanes.put(key, bytes(changed), sync=False)
            report = store.read(scope())
            assert report is not None
            assert report.corrupt, f"byte {position} ^ {mask:#x} read back as valid"
            assert report.record is None


@given(data=st.data())
def test_any_single_byte_substitution_reads_as_corrupt(
    lanes: LevelDBLaneStore, data: st.DataObject
) -> None:
    store = SessionStateStore(lanes)
    key, stored = _stored_bytes(lanes)
    position = data.draw(st.integers(0, len(stored) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != stored[position]))
    changed = bytearray(stored)
    changed[position] = byte
    lanes.put(key, bytes(changed), sync=False)
    report = store.read(scope())
    assert report is not None and report.corrupt and report.record is None
    assert bytes(changed).decode("latin-1") not in repr(report)
