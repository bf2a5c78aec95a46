"""The C2SP tlog-checkpoint note text (https://c2sp.org/tlog-checkpoint): a Merkle tree head.

Three lines, each ending in a newline: the origin (the log's name), the tree size in
ASCII decimal without leading zeroes, and the base64 RFC 6962 root hash. Signed as a
signed note (`store.chain.note`), it is the checkpoint Go's
`transparency-dev/formats/log` parses and a tlog-witness cosigns.

The log writes no extension lines (the spec does not recommend them: monitors cannot
audit them), so the parser refuses them rather than carry text nobody checks.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from store.chain.note import NoteError, strict_b64decode

HASH_BYTES = 32
_SIZE_RE = re.compile(r"0|[1-9][0-9]{0,18}")
# The largest tree size Go reads (an int64): a larger one no standard tool opens.
MAX_TREE_SIZE = 2**63 - 1


class CheckpointFormatError(NoteError):
    """A checkpoint text that is not exactly origin, size and root hash."""


@dataclass(frozen=True)
class TreeHead:
    """A log's tree head: which log, how many leaves, and their RFC 6962 root."""

    origin: str
    size: int
    root_hash: bytes

    def __post_init__(self) -> None:
        if not self.origin or "\n" in self.origin or not self.origin.isprintable():
            raise CheckpointFormatError("a checkpoint's origin is one non-empty printable line")
        if not 0 <= self.size <= MAX_TREE_SIZE:
            raise CheckpointFormatError("a checkpoint's tree size is out of range")
        if len(self.root_hash) != HASH_BYTES:
            raise CheckpointFormatError("a checkpoint's root hash is 32 bytes")

    def text(self) -> str:
        """The note text: `<origin>\\n<size>\\n<base64 root hash>\\n`."""
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root_hash).decode()}\n"

    @classmethod
    def parse(cls, text: str) -> TreeHead:
        lines = text.split("\n")
        if len(lines) != 4 or lines[3] != "":
            raise CheckpointFormatError(
                "a checkpoint is exactly three lines: origin, size, root hash"
            )
        origin, size, root = lines[:3]
        if not _SIZE_RE.fullmatch(size):
            raise CheckpointFormatError("a checkpoint's tree size is decimal, no leading zero")
        try:
            root_hash = strict_b64decode(root)
        except NoteError:
            raise CheckpointFormatError("a checkpoint's root hash is base64") from None
        return cls(origin, int(size), root_hash)
