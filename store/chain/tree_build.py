"""`build_tree`: `sessionstate db upgrade` gives a chain written before Merkle trees its tree.

A chain an older release wrote has entries but no tree nodes and no `tree_key`
(`store.chain.tree_store`). Its tree can be built only from every one of its
entries, seq 1 on: leaf i is the stored bytes of entry i+1. So a chain all of
whose entries are kept is walked in seq order, a batch of nodes at a time, and
its `tree_key` written last, in a batch that expects the seq after the last
leaf free: the service may append meanwhile (on a shared store), and then the
entries it appended are added too before the tree is declared whole. Running
it again finds the `tree_key` and does nothing.

A chain that retention pruned before it had a tree (its anchor past seq 0), or
that lacks an entry between seq 1 and its head (a recorded loss), cannot get
the leaves of the entries that are gone: nobody can, so it is reported as
unbuildable, keeps no tree, and every proof or checkpoint note asked of it is
refused (`decision_log_tree_unavailable`); its hash chain and JSON checkpoints
work as before. Nothing here checks the entries' hashes: the first checkpoint
note signed for the chain recomputes the tree from the entries the walk
verified (`store.chain.log_note`).
"""

from __future__ import annotations

import itertools
from enum import StrEnum

from store.backends.contract import ExpectationFailed, Lanes
from store.chain.evidence import EvidenceChain
from store.chain.keys import LAST_SEQ, entry_key, tree_key
from store.chain.tree_store import StoredTree
from store.chain.tree_tiles import completed_tiles

BUILD_BATCH = 1000  # entries whose nodes one batch writes
_ATTEMPTS = 100  # declare-whole batches lost to appends before the upgrade gives up


class TreeBuild(StrEnum):
    """What `build_tree` found or did."""

    PRESENT = "present"  # the chain had its tree already
    BUILT = "built"
    UNBUILDABLE = "unbuildable"  # entries are gone whose leaves the tree needs


def build_tree(lanes: Lanes, name: str) -> TreeBuild:
    """Give chain `name` its tree, if it has none and every entry from seq 1 is kept."""
    tree = StoredTree(lanes, name)
    if tree.present():
        return TreeBuild.PRESENT
    chain = EvidenceChain(lanes, name)
    if chain.anchor().seq != 0:
        return TreeBuild.UNBUILDABLE
    size = 0
    for _ in range(_ATTEMPTS):
        grown = _grow(lanes, chain, tree, size)
        if grown is None:
            return TreeBuild.UNBUILDABLE
        size = grown
        try:
            with lanes.batch(sync=True) as batch:
                batch.expect(entry_key(size + 1, name), None)
                batch.expect(tree_key(name), None)
                batch.put(tree_key(name), b"")
        except ExpectationFailed:
            if tree.present():  # another upgrade declared it first
                return TreeBuild.BUILT
            continue  # appended meanwhile: add those leaves too
        return TreeBuild.BUILT
    raise ExpectationFailed("the chain kept growing while its tree was built: run it again")


def _grow(lanes: Lanes, chain: EvidenceChain, tree: StoredTree, size: int) -> int | None:
    """Write the nodes of every entry after the first `size`, a batch at a time; the tree's
    size then, or None at a seq with no entry."""
    stored = chain.stored_entries(after_seq=size, until_seq=LAST_SEQ)
    while part := list(itertools.islice(stored, BUILD_BATCH)):
        if any(seq != size + 1 + offset for offset, (seq, _) in enumerate(part)):
            return None
        nodes = tree.appended(size, (value for _, value in part))
        with lanes.batch(sync=True) as batch:
            tree.put(batch, nodes)
            tree.put_tiles(batch, completed_tiles(nodes), nodes)
        size += len(part)
    return size
