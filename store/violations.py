"""Input rejections as field paths and rule names, never values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

Loc = tuple[str | int, ...]


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


def violations_of(error: ValidationError, *, prefix: Loc = ()) -> tuple[FieldViolation, ...]:
    """A pydantic error reduced to paths and rule names (its messages may quote values)."""
    return tuple(
        FieldViolation(loc=prefix + tuple(detail["loc"]), rule=detail["type"])
        for detail in error.errors(include_url=False, include_context=False, include_input=False)
    )
