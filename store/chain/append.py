"""`ChainExtension`: entries sealed onto one chain, added to a batch with what guards them.

Every writer of a chain extends it this one way (`EvidenceChain.append`, the
journal's group commits, `sessionstate db upgrade`'s migration, a recorded
loss): seal the bodies after the head it read (`seal`, which touches no
store), then add them to a batch of its own, which expects the key of the seq
after that head to be absent and, for a chain's first entries, writes its
marker. When another writer appended meanwhile the batch fails
(`ExpectationFailed`) and nothing of it is written, so a chain never forks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from store.backends.contract import LaneBatch
from store.canonical import Encoded
from store.chain.entry import SealedEntry, seal
from store.chain.head import ChainHead
from store.chain.keys import entry_key, marker_key


class ChainExtension:
    """Entries sealed onto chain `chain` after `start`, not written yet; `head` is the chain's
    head once they are."""

    def __init__(self, chain: str, start: ChainHead) -> None:
        self.chain = chain
        self.start = start
        self.head = start
        self.entries: list[SealedEntry] = []

    def seal(
        self,
        bodies: Sequence[Mapping[str, Any]],
        *,
        encoded_members: Sequence[Mapping[str, Encoded]] = (),
    ) -> list[SealedEntry]:
        """Seal bodies after the entries sealed so far (`seal`); the entries they became.
        Raises ValueError for a body it cannot seal, and then nothing of bodies is added."""
        sealed, self.head = seal(bodies, self.head, self.chain, encoded_members=encoded_members)
        self.entries.extend(sealed)
        return sealed

    def add_to(self, batch: LaneBatch) -> None:
        """Put the entries in batch, which then commits only if the seq after `start` is
        still free, with the chain's marker when they are its first. Nothing sealed: nothing."""
        if not self.entries:
            return
        batch.expect(entry_key(self.start.seq + 1, self.chain), None)
        if self.start.seq == 0:  # held while written? Only if entry 1 exists: the
            batch.put(marker_key(self.chain), b"")  # expectation above fails first
        for entry in self.entries:
            batch.put(entry.key, entry.value)
