"""The key codec is unambiguous: distinct keys never share bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.key_codec import LaneKey, TenantResourceLane, decode_key, scope_prefix

ids = st.text(alphabet="Aa0_-.\x00\xff", max_size=6) | st.text(max_size=40).filter(
    lambda s: len(s.encode()) <= 255
)
keys = st.builds(
    LaneKey,
    lane=st.sampled_from(list(TenantResourceLane)),
    tenant=ids,
    workspace=ids,
    session=ids,
    name=st.binary(max_size=40),
)


@given(key=keys)
def test_decode_inverts_encode(key: LaneKey) -> None:
    assert decode_key(key.encode()) == key


@given(a=keys, b=keys)
def test_distinct_keys_never_encode_to_the_same_bytes(a: LaneKey, b: LaneKey) -> None:
    if a != b:
        assert a.encode() != b.encode()


@given(key=keys)
def test_scope_prefixes_select_exactly_their_scope(key: LaneKey) -> None:
    encoded = key.encode()
    assert encoded.startswith(scope_prefix(key.lane, key.tenant, key.workspace))
    assert not encoded.startswith(scope_prefix(key.lane, key.tenant + "x"))


def test_lane_prefixes_do_not_overlap() -> None:
    prefixes = [scope_prefix(lane) for lane in TenantResourceLane]
    for a in prefixes:
        for b in prefixes:
            assert a == b or not a.startswith(b)


@pytest.mark.parametrize("raw", [b"", b"session_state", b"session_state\x00\x05ab", b"nope\x00"])
def test_foreign_bytes_do_not_decode(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_key(raw)


def test_components_over_255_bytes_are_refused() -> None:
    with pytest.raises(ValueError):
        LaneKey(TenantResourceLane.SESSION_STATE, name=b"x" * 256).encode()
