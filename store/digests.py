"""Digests of raw text: HMAC-SHA256 under a keyed, identified digest key.

Raw text is keyed, not plainly hashed, so a copy of the store does not let
anyone confirm guesses of short messages ("yes", "ok", a phone number).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import StringConstraints

KEY_ID_PATTERN = r"[A-Za-z0-9_-]{1,32}"
DIGEST_PATTERN = rf"^(sha256:[0-9a-f]{{64}}|hmac-sha256:{KEY_ID_PATTERN}:[0-9a-f]{{64}})$"
_DIGEST_RE = re.compile(DIGEST_PATTERN)

Digest = Annotated[str, StringConstraints(pattern=DIGEST_PATTERN)]
"""A well-formed digest: `sha256:<64 hex>` or `hmac-sha256:<key_id>:<64 hex>`."""


def is_digest(value: object) -> bool:
    return isinstance(value, str) and _DIGEST_RE.fullmatch(value) is not None


@dataclass(frozen=True)
class DigestKey:
    """The key raw text is digested under, and the id that names it in every digest."""

    secret: bytes = field(repr=False)
    key_id: str = ""

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise ValueError("digest key must be at least 16 bytes")
        if not self.key_id:
            # The id names the key without revealing it, so rotated keys are told apart.
            derived = hashlib.sha256(b"sessionstate/digest-key-id\x00" + self.secret).hexdigest()
            object.__setattr__(self, "key_id", "k" + derived[:15])
        if not re.fullmatch(KEY_ID_PATTERN, self.key_id):
            raise ValueError("digest key id must match " + KEY_ID_PATTERN)

    def digest_text(self, text: str) -> str:
        """`hmac-sha256:<key_id>:<hex>` of the UTF-8 bytes of text."""
        mac = hmac.new(self.secret, text.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return f"hmac-sha256:{self.key_id}:{mac.hexdigest()}"
