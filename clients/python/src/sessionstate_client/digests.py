"""Digests a model service makes itself: turn text never has to leave the process.

`DigestKey.digest_text` is the service's own HMAC-SHA256 digest
(`hmac-sha256:<key_id>:<hex>`), under a key the model service holds;
`estimate_tokens` is the service's rough token count. Both give exactly what
the service computes from the same text and key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

KEY_ID_PATTERN = r"[A-Za-z0-9_-]{1,32}"


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


def estimate_tokens(text: str) -> int:
    """A rough token count (4 UTF-8 bytes a token), as the service estimates it."""
    size = len(text.encode("utf-8", "surrogatepass"))
    return (size + 3) // 4
