"""A request's id (`X-Request-Id`): the caller's when well formed, else a new one.

Never the caller's verbatim otherwise: the id is echoed in the answer's header
and written to every log line of the request.
"""

from __future__ import annotations

import re
import secrets

_WELL_FORMED = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def request_id(incoming: str) -> str:
    """incoming when it is 1 to 64 of `A-Z a-z 0-9 . _ -`, else 16 new hex digits."""
    return incoming if _WELL_FORMED.fullmatch(incoming) else secrets.token_hex(8)
