"""The published schemas say what the models enforce, in JSON Schema's own words."""

from __future__ import annotations

from typing import Any

import pytest

from service.api.openapi import openapi_document
from service.policy.input import policy_input_schema

PYDANTIC_ONLY_KEYS = {"ge", "le", "gt", "lt", "min_length", "max_length", "multiple_of"}


def _keys(node: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(node, dict):
        found = [
            (path, key)
            for key in node
            if key in PYDANTIC_ONLY_KEYS and path.split("/")[-1] != "properties"
        ]
        for key, value in node.items():
            found += _keys(value, f"{path}/{key}")
        return found
    if isinstance(node, list):
        return [hit for index, item in enumerate(node) for hit in _keys(item, f"{path}/{index}")]
    return []


@pytest.mark.parametrize(
    "document", [openapi_document(), policy_input_schema()], ids=["openapi", "policy-input"]
)
def test_no_constraint_is_left_in_pydantic_spelling(document: dict[str, Any]) -> None:
    assert _keys(document) == []


def test_bounds_and_exactly_one_of_are_published() -> None:
    schemas = openapi_document()["components"]["schemas"]
    turn = schemas["SessionTurnInput"]
    assert {"required": ["payload"], "properties": {"payload": {"type": "string"}}} in turn["oneOf"]
    estimate = turn["properties"]["token_estimate"]["anyOf"][0]
    assert (estimate["minimum"], estimate["maximum"]) == (0, 10_000_000)
    assert schemas["SessionStateInput"]["properties"]["memory_anchors"]["maxItems"] == 256
