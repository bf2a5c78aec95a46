"""docs/compliance.md's hash recipe, as a reviewer runs it: rfc8785 over the entry without
`hash`, with nothing of the service's own code."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import rfc8785


def hashes_as_the_recipe_says(entry: Mapping[str, Any]) -> bool:
    """Whether the entry, as an answer returned it, hashes to its own `hash`."""
    body = {name: value for name, value in entry.items() if name != "hash"}
    return "sha256:" + hashlib.sha256(rfc8785.dumps(body)).hexdigest() == entry["hash"]
