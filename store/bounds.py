"""Published bounds on every list and string (they appear in the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

MAX_RAW_TEXT_CHARS = 65_536
MAX_ANCHORS_PER_LIST = 256
MAX_TURNS = 1_024
MAX_SOURCE_TRACE_IDS = 64
MAX_CONTEXT_WINDOW = 10_000_000
MAX_TOKEN_ESTIMATE = 10_000_000

IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"

Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN)]
"""Ids and names chosen by the caller: anchor, turn, trace and state ids, model names."""

RawText = Annotated[str, StringConstraints(max_length=MAX_RAW_TEXT_CHARS)]
"""Raw user or assistant text: digested where it enters, then dropped."""
