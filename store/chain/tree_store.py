"""`StoredTree`: one chain's Merkle tree as the lane store keeps it.

The tree's algorithms (`store.chain.merkle_tree`) read nodes through a callback
and hand back nodes to write; this puts them in the store: node (level, index)
of chain C is the key `node_key(C, node)` in the `merkle_node` lane, its 32
bytes the value. A chain has a tree when `tree_key` is stored: its entries'
first batch writes it (`store.chain.append`), and `sessionstate db upgrade`
writes it for a chain that an older release wrote (`store.chain.tree_build`).
A chain without it gets no nodes: retention pruned entries of it before it had
a tree, or it is waiting for the upgrade, and no proof is served for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from store.backends.contract import LaneBatch, Lanes, LaneView
from store.chain.keys import node_key, tile_key, tree_key
from store.chain.merkle_retention import prunable
from store.chain.merkle_tree import NodeAt, NodeId, appended_all, entry_leaf
from store.chain.rfc9162 import HASH_SIZE
from store.chain.tree_frontier import edge
from store.chain.tree_tiles import (
    TILE_BYTES,
    TileId,
    complete,
    nodes_of,
    offset_in,
    tile_of,
    tiles_below,
)

T = TypeVar("T")
log = logging.getLogger("sessionstate.decisions")
_PLACEHOLDER = bytes(HASH_SIZE)  # what a naming run reads in place of each node


class TreeNodeMissing(LookupError):
    """A node the tree should hold is not stored (or is not 32 bytes): retention pruned it,
    or the store was damaged. Names no key."""


class StoredTree:
    """The Merkle tree of chain `chain` in `view`."""

    def __init__(self, view: LaneView, chain: str) -> None:
        self._view = view
        self.chain = chain

    def present(self) -> bool:
        """Whether the chain has a tree (its `tree_key` is stored)."""
        return self.marker() is not None

    def marker(self) -> bytes | None:
        """The stored `tree_key` value (None: the chain has no tree)."""
        return self._view.get(tree_key(self.chain))

    def node_at(self, level: int, index: int) -> bytes:
        """The stored node, or `TreeNodeMissing`."""
        stored = self._view.get(node_key(self.chain, NodeId(level, index)))
        if stored is None or len(stored) != HASH_SIZE:
            raise TreeNodeMissing("a node of the decision log's Merkle tree is not stored")
        return stored

    def read_through(self, make: Callable[[NodeAt], T], holds: int = 0) -> T:
        """`make(node_at)` with every node it reads fetched from the store in one pass: the
        tree's algorithms read nodes that follow from the sizes alone, never from a hash,
        so a first run with placeholder hashes names them, one `get_many` reads them, and
        a second run over what was read makes the answer (a proof's O(log n) nodes, in one
        reader or one statement instead of one each). Nodes of the tiles complete in a tree
        of `holds` leaves (`store.chain.tree_tiles`) are read as their tiles, one value for
        each; a tile that is not stored, as its nodes, in a second pass."""
        wanted: set[tuple[int, int]] = set()  # (level, index): NodeId's fields, its hash

        def naming(level: int, index: int) -> bytes:
            wanted.add((level, index))
            return _PLACEHOLDER

        make(naming)
        if not wanted:  # e.g. a leaf appended to a tree of even size: nothing to read
            return make(_no_node)
        read = self._read_nodes({NodeId(*pair) for pair in wanted}, holds)

        def node_at(level: int, index: int) -> bytes:
            stored = read.get((level, index))
            if stored is None or len(stored) != HASH_SIZE:
                raise TreeNodeMissing("a node of the decision log's Merkle tree is not stored")
            return stored

        return make(node_at)

    def _read_nodes(self, wanted: set[NodeId], holds: int) -> dict[tuple[int, int], bytes | None]:
        """The wanted nodes: from their complete tiles and the other nodes in one pass,
        then the nodes of tiles that were not stored."""
        tile_for = {node: tile_of(node) for node in wanted}
        tiles = sorted({tile for tile in tile_for.values() if complete(tile, holds)})
        tiled = set(tiles)
        loose = [node for node, tile in tile_for.items() if tile not in tiled]
        keys = [tile_key(self.chain, tile) for tile in tiles]
        values = self._view.get_many(keys + [node_key(self.chain, node) for node in loose])
        read: dict[tuple[int, int], bytes | None] = {}
        read.update(zip(loose, values[len(keys) :], strict=True))
        stored = dict(zip(tiles, values[: len(keys)], strict=True))
        missing = []
        for node, tile in tile_for.items():
            if tile not in tiled:
                continue
            value = stored[tile]
            if value is None or len(value) != TILE_BYTES:
                missing.append(node)
                continue
            at = offset_in(node, tile)
            read[node] = value[at : at + HASH_SIZE]
        if missing:
            again = self._view.get_many([node_key(self.chain, node) for node in missing])
            read.update(zip(missing, again, strict=True))
        return read

    def appended(
        self,
        size: int,
        stored_entries: Iterable[bytes],
        edge_nodes: Mapping[NodeId, bytes] | None = None,
    ) -> dict[NodeId, bytes]:
        """The nodes entries add to a tree of `size` leaves, from their stored bytes and the
        tree's old edge (`merkle_tree.appended_all`): `edge_nodes` when the caller knows
        them (`store.chain.tree_frontier`), else only what it needs, read in one pass."""
        leaves = [entry_leaf(stored) for stored in stored_entries]
        if edge_nodes is None:
            return self.read_through(lambda node_at: appended_all(size, leaves, node_at))
        known = edge_nodes

        def node_at(level: int, index: int) -> bytes:
            found = known.get(NodeId(level, index))
            if found is None:
                raise TreeNodeMissing("a node of the decision log's Merkle tree is not known")
            return found

        return appended_all(size, leaves, node_at)

    def edge(self, size: int) -> dict[NodeId, bytes]:
        """The stored roots of the complete subtrees a tree of `size` leaves is made of
        (`tree_frontier.edge`), in one pass; a node not stored is left out."""
        names = edge(size)
        if not names:
            return {}
        values = self._view.get_many([node_key(self.chain, node) for node in names])
        return {
            node: value
            for node, value in zip(names, values, strict=True)
            if value is not None and len(value) == HASH_SIZE
        }

    def put(self, batch: LaneBatch, nodes: Mapping[NodeId, bytes]) -> None:
        for node, hash_ in nodes.items():
            batch.put(node_key(self.chain, node), hash_)

    def put_tiles(
        self, batch: LaneBatch, tiles: Iterable[TileId], new: Mapping[NodeId, bytes] | None = None
    ) -> None:
        """Put each complete tile, whole: its nodes from `new` (those batch puts) and the
        store, read in one pass. A tile one of whose nodes is not there (retention deleted
        the lower ones of a tile it cut) is not put: its nodes serve in its place."""
        tiles, new = sorted(tiles), new or {}
        members = [node for tile in tiles for node in nodes_of(tile)]
        older = [node for node in members if node not in new]
        keys = [node_key(self.chain, node) for node in older]
        read = dict(zip(older, self._view.get_many(keys) if keys else [], strict=True))
        for tile in tiles:
            parts = [new.get(node) or read.get(node) or b"" for node in nodes_of(tile)]
            if all(len(part) == HASH_SIZE for part in parts):
                batch.put(tile_key(self.chain, tile), b"".join(parts))

    def prune(self, batch: LaneBatch, kept_from_before: int, kept_from: int) -> None:
        """Delete, in batch, the nodes no proof needs once the first kept leaf moves from
        kept_from_before to kept_from (`merkle_retention.prunable`), and the tiles wholly
        below kept_from (the few of their nodes a proof still needs stay as nodes)."""
        for level, start, stop in prunable(kept_from_before, kept_from):
            for index in range(start, stop):
                batch.delete(node_key(self.chain, NodeId(level, index)))
        for tile in tiles_below(kept_from_before, kept_from):  # read as their nodes from now
            batch.delete(tile_key(self.chain, tile))


def _no_node(level: int, index: int) -> bytes:
    raise AssertionError("a second run read a node the first did not")  # pragma: no cover


def drop_tree(lanes: Lanes, chain: str) -> None:
    """Delete the chain's `tree_key` (logged as `decision_log_tree_dropped`): a tree found
    not to hold serves no proof from then on, and `db upgrade` builds it again."""
    log.error("decision_log_tree_dropped", extra={"chain": chain})
    with lanes.batch(sync=True) as batch:
        batch.delete(tree_key(chain))
