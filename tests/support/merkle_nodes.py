"""A Merkle tree's node store for the tests: a dict keyed by (level, index) that counts reads,
grown through `store.chain.merkle_tree.appended` exactly as the journal would grow it."""

from __future__ import annotations

from collections.abc import Iterable

from store.chain.merkle_tree import NodeId, appended, entry_leaf


class Nodes:
    """The stored nodes of one tree; `reads` counts `node_at` calls, `writes` the nodes the
    last append handed back."""

    def __init__(self) -> None:
        self.stored: dict[NodeId, bytes] = {}
        self.size = 0
        self.reads = 0
        self.writes = 0

    def node_at(self, level: int, index: int) -> bytes:
        self.reads += 1
        return self.stored[NodeId(level, index)]

    def append(self, data: bytes) -> None:
        new = appended(self.size, entry_leaf(data), self.node_at)
        assert all(node not in self.stored for node, _ in new)  # a node is written once
        self.stored.update(new)
        self.size += 1
        self.writes = len(new)

    def extend(self, inputs: Iterable[bytes]) -> Nodes:
        for data in inputs:
            self.append(data)
        return self

    def counted(self) -> int:
        """The reads since the last call, and start counting again."""
        reads, self.reads = self.reads, 0
        return reads


def leaf_inputs(n: int) -> list[bytes]:
    """n distinct leaf inputs of varied lengths."""
    return [str(i).encode() + b"-" * (i % 3) for i in range(n)]
