"""One canonical encoding for every stored value and every digest: RFC 8785 (JCS).

Most values this service encodes (records, decision entries) are plain:
strings, integers in JSON's exact range, booleans, nulls, lists and objects
with ASCII keys, and floats such as a decision's `latency_ms`. For those,
RFC 8785's form is exactly Python's own compact, key-sorted JSON (the same
string escapes; ASCII keys sort the same by UTF-16 code unit as by code
point), which the C encoder writes many times faster than `rfc8785`.

A float is plain when it is finite, not integral, and `repr` writes it without
an exponent (1e-4 <= |x| < 1e16): both `repr` and ECMAScript's Number
serialisation (which RFC 8785 uses) write the shortest digits that round-trip,
and in that range both write them as a plain decimal. Integral floats (`3.0`,
which JCS writes `3`), exponents, NaN and infinities, other key sets and other
types go through `rfc8785`, which also raises for what JCS cannot encode.
tests/store/test_canonical.py checks byte equality with `rfc8785` over generated values.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import rfc8785

_MAX_EXACT = 2**53 - 1  # rfc8785's integer domain
_MAX_WALK = 1_000_000  # values a plainness check looks at before leaving the rest to rfc8785
_PLAIN = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical JSON bytes: same value, same bytes, whatever the key order."""
    return encode(value)[0]


def encode(value: Any) -> tuple[bytes, bool]:
    """The canonical bytes, and whether the value was plain: then `json.loads` of the bytes
    gives back an equal value (lists for tuples), with nothing lost or rounded."""
    if _is_plain(value):
        try:
            return _PLAIN.encode(value).encode("utf-8"), True
        except UnicodeEncodeError:  # a lone surrogate: rfc8785 says what is wrong
            pass
    return bytes(rfc8785.dumps(value)), False


class Encoded(NamedTuple):
    """A value with its canonical bytes, encoded once, ahead of the moment they are needed."""

    value: Any
    data: bytes
    plain: bool  # as `encode` says: the bytes read back as an equal value

    @classmethod
    def of(cls, value: Any) -> Encoded:
        data, plain = encode(value)
        return cls(value, data, plain)


def canonical_object(members: Mapping[str, bytes]) -> bytes:
    """The canonical bytes of an object whose ASCII-named members are already encoded."""
    if not all(type(name) is str and name.isascii() for name in members):
        raise ValueError("member names must be ASCII")  # they sort by code point then
    return b"{" + b",".join(_key(name) + b":" + members[name] for name in sorted(members)) + b"}"


@functools.lru_cache(maxsize=256)  # member names are few: an entry's, a summary's
def _key(name: str) -> bytes:
    return _PLAIN.encode(name).encode("ascii")


def sha256_digest(data: bytes) -> str:
    """`sha256:<hex>` of the bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_digest(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of a value."""
    return sha256_digest(canonical_json(value))


def _is_plain(value: Any) -> bool:
    try:
        return _plain(value)
    except RecursionError:  # absurd nesting, or a cycle: rfc8785 fails on it as before
        return False


def _plain(value: Any) -> bool:
    # Iterative (a stack instead of recursion): this walk runs on every value encoded. A
    # value too big to walk here, or a cycle, is left to rfc8785 (which raises on a cycle).
    stack = [value]
    budget = _MAX_WALK
    while stack:
        budget -= 1
        if not budget:
            return False
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is dict:
            for key in item:
                if type(key) is not str or not key.isascii():
                    return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind is int:
            if not -_MAX_EXACT <= item <= _MAX_EXACT:
                return False
        elif kind is float:
            if not math.isfinite(item) or item.is_integer() or "e" in repr(item):
                return False
        else:
            return False
    return True
