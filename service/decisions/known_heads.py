"""`KnownHeads`: each chain's head as the journal last committed or read it.

The journal seals a batch on the heads it knows, not on a read of each chain:
another writer that appended meanwhile makes the commit fail, and the journal
reads those heads again (`read`). Every read checks the chain against the
signed head the service remembers for it (`store.chain.signed_head.SignedHeads`): a
chain whose stored entries no longer reach it is never kept as known, so it is
read again next time; it is logged once as `decision_log_behind_signed_head`,
and counted until a read finds it caught up.

Beside each head the journal committed it keeps the tree's frontier after it
(`store.chain.tree_frontier`), so that the next append reads nothing of the tree;
a head read from the store has none, and a read or `forget` drops it. At most
`FRONTIERS_KEPT` are kept, those of the chains committed to most recently.
"""

from __future__ import annotations

import logging
import threading

from store.backends.contract import Lanes
from store.chain.evidence import EvidenceChain
from store.chain.head import ChainHead
from store.chain.signed_head import SignedHeads
from store.chain.tree_frontier import TreeFrontier

log = logging.getLogger("sessionstate.journal")
# Frontiers kept at most (about 2.8 KiB each at a million entries): the chains appended to
# most recently; one that was let go costs its next append one read.
FRONTIERS_KEPT = 4096


class KnownHeads:
    """Chain heads as last committed or read; None for a chain behind its signed head."""

    def __init__(self, lanes: Lanes, signed_heads: SignedHeads | None) -> None:
        self._lanes = lanes
        self._signed_heads = signed_heads
        self._heads: dict[str, ChainHead] = {}
        self._frontiers: dict[str, TreeFrontier] = {}  # after the head in _heads, if any
        self._behind: set[str] = set()  # chains behind their signed head, as last read
        self._guard = threading.Lock()

    def head(self, name: str) -> ChainHead | None:
        """The head known for chain `name`, else as read now."""
        with self._guard:
            known = self._heads.get(name)
        return known if known is not None else self.read(name)

    def read(self, name: str) -> ChainHead | None:
        """The stored head of chain `name`, now known; None when the chain is behind its
        signed head. Raises `ChainCorrupt` for a head that does not read."""
        chain = EvidenceChain(self._lanes, name)
        head = chain.head()
        behind = self._signed_heads is not None and self._signed_heads.behind(chain)
        with self._guard:
            newly = behind and name not in self._behind
            self._frontiers.pop(name, None)
            if behind:
                self._behind.add(name)
                self._heads.pop(name, None)
            else:
                self._behind.discard(name)
                self._heads[name] = head
        if newly:
            log.error("decision_log_behind_signed_head", extra={"chain": name})
        return None if behind else head

    def frontier(self, name: str) -> TreeFrontier | None:
        """The tree's frontier after the head known for chain `name`, if the journal kept it."""
        with self._guard:
            return self._frontiers.get(name)

    def committed(
        self, heads: dict[str, ChainHead], frontiers: dict[str, TreeFrontier | None]
    ) -> None:
        with self._guard:
            self._heads.update(heads)
            for name, frontier in frontiers.items():
                self._frontiers.pop(name, None)  # re-inserted last: the newest
                if frontier is not None:
                    self._frontiers[name] = frontier
            while len(self._frontiers) > FRONTIERS_KEPT:  # the longest unused goes first
                del self._frontiers[next(iter(self._frontiers))]

    def forget(self) -> None:
        """Read every head again: a write of unknown outcome may have landed."""
        with self._guard:
            self._heads.clear()
            self._frontiers.clear()

    @property
    def behind(self) -> int:
        """How many chains were found behind their signed head when last read."""
        with self._guard:
            return len(self._behind)
