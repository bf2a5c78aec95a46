"""Strict JSON: one document, UTF-8, no duplicate member names, no NaN or Infinity.

The server reads JSON it did not write this way: request bodies
(`service.http.body`) and the decision log's stored entries (`store.chain.entry`).
Duplicate member names mean different things to different parsers, and NaN and
Infinity are not JSON, so neither is accepted. The shipped evidence verifier
(`service.decisions.bundle_verifier`) keeps a copy of its own on purpose: it
runs with nothing of this package installed.
"""

from __future__ import annotations

import json
from typing import Any


class MalformedJson(ValueError):
    """Not one strict JSON document. Its message is fixed: it never quotes the input."""

    def __init__(self) -> None:
        super().__init__("not one strict JSON document")


def strict_loads(data: bytes | str) -> Any:
    """The JSON document data holds (bytes as UTF-8); `MalformedJson` if it holds none."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, object_pairs_hook=_unique_members, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):  # messages may quote the input
        raise MalformedJson() from None


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("duplicate member name")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError("NaN and Infinity are not JSON")
