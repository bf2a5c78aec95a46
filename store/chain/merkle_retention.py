"""Which Merkle tree nodes retention may delete with the entries it prunes.

Retention prunes a chain's oldest entries; the tree's nodes (`store.chain.merkle_tree`)
are fewer than two per entry, 32 bytes each, but kept forever they would still
grow without bound beside a log whose entries do not, so they go too, all but
the few that later proofs need.

Say retention keeps leaves from index `kept_from` on (pruning the entries below
seq S keeps leaf S-1 on). What is still asked of the tree: the head of every
size >= kept_from, inclusion proofs of the kept leaves in those trees,
consistency proofs between two such sizes, and appends. Each of those reads, of
the nodes wholly below kept_from, only the complete subtrees that make up the
first kept_from leaves (a node the left edge of a kept leaf's path, or of a
size's, ends at): at each level L at most the one node kept_from >> L - 1, when
that count is odd. Every other node wholly below kept_from may go: at level L,
the indexes below (kept_from >> L) rounded down to even. Nodes that reach past
kept_from stay. A consistency proof from a size below kept_from (a witness that
last signed before the cut) cannot be made any more: prune below the smallest
size a witness still has to be shown from.

The set only grows as kept_from does, so pruning again drops only what the last
pruning did not: `prunable(before, after)` is the difference.
"""

from __future__ import annotations

from typing import NamedTuple


class NodeRange(NamedTuple):
    """The nodes of one level with index in [start, stop)."""

    level: int
    start: int
    stop: int


def prunable(kept_from_before: int, kept_from: int) -> list[NodeRange]:
    """The nodes that may be deleted when the first kept leaf moves from kept_from_before to
    kept_from (leaf indexes; 0 before the first pruning), level by level."""
    if not 0 <= kept_from_before <= kept_from:
        raise ValueError("retention only moves forward: 0 <= kept_from_before <= kept_from")
    ranges = []
    for level in range(kept_from.bit_length()):
        start, stop = _droppable(kept_from_before, level), _droppable(kept_from, level)
        if start < stop:
            ranges.append(NodeRange(level, start, stop))
    return ranges


def _droppable(kept_from: int, level: int) -> int:
    """How many of a level's first nodes are wholly below kept_from and needed by no proof."""
    return (kept_from >> level) & ~1
