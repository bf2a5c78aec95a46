"""One canonical encoding for every stored value and every digest: RFC 8785 (JCS)."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical JSON bytes: same value, same bytes, whatever the key order."""
    return bytes(rfc8785.dumps(value))


def sha256_digest(data: bytes) -> str:
    """`sha256:<hex>` of the bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_digest(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of a value."""
    return sha256_digest(canonical_json(value))
