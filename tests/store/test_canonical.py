"""canonical_json is RFC 8785 exactly: its fast path for plain values agrees with `rfc8785`."""

from __future__ import annotations

from typing import Any

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from store.canonical import canonical_json, canonical_object

TEXT = st.text(st.characters(exclude_categories=()))  # surrogates, controls, astral planes
KEYS = st.one_of(
    TEXT, st.text(st.characters(max_codepoint=0x7F)), st.sampled_from(["a", "é", "😀", "\ue000"])
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.sampled_from([2**53 - 1, -(2**53 - 1), 2**53, -(2**53)]),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(KEYS, inner, max_size=5),
    ),
    max_leaves=30,
)


def reference(value: Any) -> bytes | type[BaseException]:
    try:
        return bytes(rfc8785.dumps(value))
    except Exception as error:
        return type(error)


def assert_agrees_with_rfc8785(value: Any) -> None:
    """The same bytes as rfc8785, or refused as rfc8785 refuses it."""
    expected = reference(value)
    if isinstance(expected, bytes):
        assert canonical_json(value) == expected
        return
    try:
        canonical_json(value)
    except expected:
        return
    raise AssertionError("canonical_json encoded what rfc8785 refuses")


@given(VALUES)
def test_canonical_json_is_rfc8785(value: Any) -> None:
    assert_agrees_with_rfc8785(value)


@settings(max_examples=5000)
@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(min_value=-1e17, max_value=1e17),
        st.floats(min_value=-1e-3, max_value=1e-3),
        st.integers(min_value=0, max_value=10**9).map(lambda n: n / 1000),  # latency_ms
        st.sampled_from([1e-4, -1e-4, 9.999999999999998e15, 1e16, 1e-5, 5e-324, 0.1 + 0.2]),
    )
)
def test_every_float_alone_and_in_an_object_is_rfc8785(number: float) -> None:
    for value in (number, {"latency_ms": number, "a": [number]}):
        assert_agrees_with_rfc8785(value)


def test_plain_values_and_the_rest_agree_on_known_cases() -> None:
    for value in [
        {"b": 1, "a": [True, None, 'x\u0000\u001f\u007f"\\\n'], "é": "ü", "😀": 1, "\ue000": 2},
        {"n": 2**53 - 1, "f": 1.0, "e": 1e21, "s": "😀"},
        ("t", 1),
    ]:
        assert canonical_json(value) == rfc8785.dumps(value)


@given(st.dictionaries(st.text(st.characters(max_codepoint=0x7F)), VALUES, max_size=6))
def test_an_object_of_encoded_members_is_the_object_encoded(value: dict[str, Any]) -> None:
    try:
        whole = canonical_json(value)
    except Exception:
        return  # rfc8785 refuses a member: nothing to compare
    members = {name: canonical_json(item) for name, item in value.items()}
    assert canonical_object(members) == whole
