"""Input rejections as field paths and rule names, never values, never a caller's key.

A path names only what the model itself names: its fields, and positions in
lists. A step the caller chose (an unknown member, a mapping's key) is shown
as a fixed placeholder: a key named like a password must not come back.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

Loc = tuple[str | int, ...]

UNKNOWN_MEMBER = "(unknown member)"
UNKNOWN_PARAMETER = "(unknown parameter)"

_SEQUENCES = (list, tuple, set, frozenset, Sequence)


@dataclass(frozen=True)
class FieldViolation:
    """One broken rule: where (`loc`) and which rule, with no value in it."""

    loc: Loc
    rule: str

    def to_json(self) -> dict[str, object]:
        return {"loc": list(self.loc), "rule": self.rule}


class InputRejected(Exception):
    """The caller's input broke rules; carries only paths and rule names."""

    def __init__(self, violations: Sequence[FieldViolation]) -> None:
        self.violations = tuple(violations)
        super().__init__(f"{len(self.violations)} input rule(s) broken")


def violations_of(
    error: ValidationError,
    model: type[BaseModel],
    *,
    prefix: Loc = (),
    unknown: str = UNKNOWN_MEMBER,
) -> tuple[FieldViolation, ...]:
    """A pydantic error of `model` reduced to paths and rule names (its messages may quote
    values), every path step that `model` does not name replaced by `unknown`."""
    violations = []
    for detail in error.errors(include_url=False, include_context=False, include_input=False):
        loc = named_loc(model, tuple(detail["loc"]), unknown)
        if detail["type"] == "extra_forbidden" and loc:  # the last step is the caller's key
            loc = (*loc[:-1], unknown)
        violations.append(FieldViolation(loc=prefix + loc, rule=detail["type"]))
    return tuple(violations)


def named_loc(model: type[BaseModel], loc: Loc, unknown: str) -> Loc:
    """`loc` walked along `model`'s fields: list positions and field names are kept,
    anything else (a key the caller chose, a step this walk does not know) is `unknown`."""
    shape: object = model
    named: list[str | int] = []
    for step in loc:
        shape = _unwrapped(shape)
        if isinstance(step, int):
            named.append(step)  # a position, never a name
            shape = _item_type(shape, step)
        elif isinstance(shape, type) and issubclass(shape, BaseModel) and step in _fields(shape):
            named.append(step)
            shape = _fields(shape)[step]
        else:
            named.append(unknown)
            shape = None
    return tuple(named)


def _fields(model: type[BaseModel]) -> dict[str, object]:
    """The names a model's fields go by on the wire, with their types."""
    names: dict[str, object] = {}
    for name, field in model.model_fields.items():
        names[name] = field.annotation
        if isinstance(field.alias, str):
            names[field.alias] = field.annotation
    return names


def _unwrapped(shape: object) -> object:
    """`Annotated[X, ...]` and `X | None` as X; a real union stays as it is."""
    while True:
        origin = get_origin(shape)
        if origin is Annotated:
            shape = get_args(shape)[0]
        elif origin in (Union, types.UnionType):
            members = [arg for arg in get_args(shape) if arg is not type(None)]
            if len(members) != 1:
                return shape
            shape = members[0]
        else:
            return shape


def _item_type(shape: object, index: int) -> object:
    origin = get_origin(shape)
    if origin not in _SEQUENCES:
        return None
    args = get_args(shape)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return args[index] if 0 <= index < len(args) else None
    return args[0] if args else None
