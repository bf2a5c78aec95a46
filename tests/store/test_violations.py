"""Validation errors name the model's own fields and positions, never a key the caller chose."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from store.record.inputs import SessionStateInput
from store.record.violations import UNKNOWN_MEMBER, UNKNOWN_PARAMETER, violations_of
from tests.support.factories import state_input

CANARY = "hunter2-password-canary"


def located(model: type[BaseModel], body: Any, **options: Any) -> set[tuple[object, ...]]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return {(v.loc, v.rule) for v in violations_of(caught.value, model, **options)}


def test_unknown_members_are_reported_by_position_at_every_depth() -> None:
    body = state_input() | {CANARY: "x"}
    body["runtime_profile"] = body["runtime_profile"] | {CANARY: 1}
    body["turns"] = [{"turn_id": "t", "role": "user", "payload": "p", CANARY: True}]
    assert located(SessionStateInput, body) == {
        ((UNKNOWN_MEMBER,), "extra_forbidden"),
        (("runtime_profile", UNKNOWN_MEMBER), "extra_forbidden"),
        (("turns", 0, UNKNOWN_MEMBER), "extra_forbidden"),
    }


def test_an_unknown_member_named_like_a_field_is_still_unknown() -> None:
    body = state_input()
    body["runtime_profile"] = body["runtime_profile"] | {"turns": []}
    assert located(SessionStateInput, body) == {
        (("runtime_profile", UNKNOWN_MEMBER), "extra_forbidden")
    }


def test_known_paths_keep_their_names_and_positions() -> None:
    body = state_input(source_trace_ids=["ok", "not ok"], turns=["not an object"])
    assert located(SessionStateInput, body) == {
        (("source_trace_ids", 1), "string_pattern_mismatch"),
        (("turns", 0), "model_type"),
    }


class _Tags(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    labels: dict[str, int] = Field(default_factory=dict)
    pair: tuple[int, str] = (0, "")
    either: int | str = 0
    schema_: str = Field(default="", alias="schema")


def test_mapping_keys_are_caller_chosen_too() -> None:
    assert located(_Tags, {"labels": {CANARY: "not a number"}}) == {
        (("labels", UNKNOWN_MEMBER), "int_type")
    }


def test_tuple_positions_and_aliases_are_kept() -> None:
    assert located(_Tags, {"pair": (1, 2), "schema": 3}) == {
        (("pair", 1), "string_type"),
        (("schema",), "string_type"),
    }


def test_steps_a_walk_cannot_name_fail_closed() -> None:
    # pydantic names the union member it tried; that is no field of the model.
    rules = located(_Tags, {"either": 1.5})
    assert {loc for loc, _ in rules} == {("either", UNKNOWN_MEMBER)}


def test_prefix_and_placeholder_for_query_parameters() -> None:
    rules = located(_Tags, {CANARY: "1"}, prefix=("query",), unknown=UNKNOWN_PARAMETER)
    assert rules == {(("query", UNKNOWN_PARAMETER), "extra_forbidden")}
