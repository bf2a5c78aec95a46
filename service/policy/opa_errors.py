"""OPA's errors (`opa check` or `opa eval` with `--format json`) as short lines to show."""

from __future__ import annotations

import json

MAX_ERRORS = 5  # enough to find the first mistake; a broken file can report hundreds


def check_errors(output: str, prefix: str, *, fallback: str) -> list[str]:
    """`opa check --format json`'s errors as "path:row: code: message" (path without prefix),
    each once, at most `MAX_ERRORS` and a count of the rest; [fallback] when unreadable."""
    try:
        errors = json.loads(output[output.find("{") :])["errors"]
        found = [
            f"{error['location']['file'].removeprefix(prefix)}:{error['location']['row']}: "
            f"{error['code']}: {error['message']}"
            if isinstance(error.get("location"), dict)
            else f"{error['code']}: {error['message']}"
            for error in errors
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        found = [fallback]
    unique = list(dict.fromkeys(found))
    if len(unique) > MAX_ERRORS:
        unique = [*unique[:MAX_ERRORS], f"and {len(unique) - MAX_ERRORS} more"]
    return unique
