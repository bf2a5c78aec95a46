"""Published bounds on every list and string (they appear in the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, StringConstraints
from pydantic.config import JsonDict

MAX_RAW_TEXT_CHARS = 65_536
MAX_ANCHORS_PER_LIST = 256
MAX_TURNS = 1_024  # the most turns a record keeps (v1 records hold up to this many)
# A write carries the turns a record keeps plus what is new, so it may hold twice as many:
# a full record, even a v1 record of 1,024 turns, plus up to 1,024 new turns always fits.
MAX_TURNS_PER_WRITE = 2 * MAX_TURNS
MIN_TURNS_KEPT = 16  # bounds and default of SESSIONSTATE_MAX_TURNS_KEPT, the window
DEFAULT_TURNS_KEPT = 256
MAX_SAFE_INTEGER = 2**53 - 1  # the largest integer every JSON reader (OPA, JavaScript) keeps exact
MAX_SOURCE_TRACE_IDS = 64
MAX_CONTEXT_WINDOW = 10_000_000
MAX_TOKEN_ESTIMATE = 10_000_000

IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"

Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN)]
"""Ids and names chosen by the caller: anchor, turn, trace and state ids, model names."""

RawText = Annotated[str, StringConstraints(max_length=MAX_RAW_TEXT_CHARS)]
"""Raw user or assistant text: digested where it enters, then dropped."""


def integral_number(value: object) -> object:
    """JSON Schema's `integer` admits 57.0; strings and booleans stay refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(integral_number)]
"""An integer as JSON Schema means it: 57 or 57.0, never "57" or true."""


def exactly_one_of(first: str, second: str) -> JsonDict:
    """JSON Schema for 'exactly one of two optional fields is a string' (null counts as absent)."""
    return {
        "oneOf": [
            {"required": [name], "properties": {name: {"type": "string"}}}
            for name in (first, second)
        ]
    }
