"""`DerivedOnce`: a frozen pydantic model whose derived values are computed once.

A frozen model's fields never change, so a value derived from them (a digest,
a canonical encoding) may be kept on the instance with
`functools.cached_property`. pydantic's `model_copy` copies such kept values
along with the fields; here it drops them, so a copy with other field values
derives its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any, Self

from pydantic import BaseModel


class DerivedOnce(BaseModel):
    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        for klass in type(self).__mro__:
            for name, member in vars(klass).items():
                if isinstance(member, cached_property):
                    copied.__dict__.pop(name, None)
        return copied
