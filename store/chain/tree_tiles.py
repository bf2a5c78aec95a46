"""Complete tiles of a chain's Merkle tree: 8 levels of nodes in one value, written once.

A proof reads about two nodes a level (`store.chain.merkle_tree`), each its own key: at
a million leaves some 27 keys in as many scattered blocks. A tile (as C2SP tlog-tiles
groups them: tile level T covers node levels 8T to 8T+7, tile N of it the nodes over
leaves [N * 256**(T+1), (N+1) * 256**(T+1))) holds the 510 nodes of those levels under
one key, so that a proof reads one value for each 8 levels a complete tile covers, and
nodes only along the ragged right edge.

A tile is written once, whole, when the nodes it holds are known to be the ones their
entries give: by the signing of the checkpoint note that first covers its last leaf,
which recomputes the nodes added since the last note anyway
(`store.chain.log_note.checked_root`), and by `db upgrade` as it builds a tree. So an
append writes only its few nodes, and a proof, asked against a signed note, finds the
tiles complete in that note's tree. It is final, never rewritten. Nodes stay stored
beside tiles: appends and signing read them, retention keeps the few a proof still
needs, and a tile that is not there (a tree whose notes were signed before tiles, a
signing cut short, a tile retention deleted) is read as its nodes.

A tile's value: its nodes level by level, bottom first, each level in index order,
32 bytes each (256 + 128 + ... + 2 = 510 of them, 16,320 bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from store.chain.merkle_tree import INDEX_BYTES, NodeId
from store.chain.rfc9162 import HASH_SIZE

HEIGHT = 8  # node levels a tile covers
WIDTH = 1 << HEIGHT  # nodes at a tile's bottom level
NODES = 2 * WIDTH - 2  # nodes a tile holds: every level but the one its top pair makes
TILE_BYTES = NODES * HASH_SIZE
_TILE = b"t"


class TileId(NamedTuple):
    level: int  # tile level: node levels HEIGHT * level to HEIGHT * level + HEIGHT - 1
    position: int


def tile_name(tile: TileId) -> bytes:
    """A tile's key name beside the nodes': `t`, its level, its index (10 bytes, where a
    node's name is 9: no tile name is a node's)."""
    return _TILE + bytes([tile.level]) + tile.position.to_bytes(INDEX_BYTES, "big")


def tile_of(node: NodeId) -> TileId:
    """The tile that holds the node."""
    within = node.level % HEIGHT
    return TileId(node.level // HEIGHT, node.position >> (HEIGHT - within))


def offset_in(node: NodeId, tile: TileId) -> int:
    """Where the node's 32 bytes start in the value of its tile (`tile_of(node)`)."""
    within = node.level % HEIGHT
    before = 2 * WIDTH - (2 * WIDTH >> within)  # the nodes of the lower levels of the tile
    first = tile.position * (WIDTH >> within)  # the tile's first index at this level
    return (before + node.position - first) * HASH_SIZE


def complete(tile: TileId, size: int) -> bool:
    """Whether a tree of `size` leaves holds every node of the tile."""
    return size >= (tile.position + 1) << (HEIGHT * (tile.level + 1))


def levels_of(tile: TileId) -> Iterator[tuple[int, int, int]]:
    """The tile's node levels in the order its value holds them, bottom first: (node level,
    first index, index after the last)."""
    for within in range(HEIGHT):
        count = WIDTH >> within
        yield tile.level * HEIGHT + within, tile.position * count, (tile.position + 1) * count


def nodes_of(tile: TileId) -> Iterator[NodeId]:
    """The tile's nodes in the order its value holds them."""
    for level, first, stop in levels_of(tile):
        for position in range(first, stop):
            yield NodeId(level, position)


def completed_by(node: NodeId) -> TileId | None:
    """The tile that writing `node` completes: the right one of its top pair."""
    if node.level % HEIGHT != HEIGHT - 1 or node.position % 2 == 0:
        return None
    return tile_of(node)


def completed_tiles(nodes: Iterable[NodeId]) -> set[TileId]:
    """The tiles that writing `nodes` completes."""
    return {tile for node in nodes if (tile := completed_by(node)) is not None}


def tiles_below(kept_from_before: int, kept_from: int) -> Iterator[TileId]:
    """The tiles wholly below leaf kept_from but not wholly below kept_from_before: those
    retention deletes when the first kept leaf moves from one to the other."""
    level = 0
    while (span := 1 << (HEIGHT * (level + 1))) <= kept_from:
        for position in range(kept_from_before // span, kept_from // span):
            yield TileId(level, position)
        level += 1
