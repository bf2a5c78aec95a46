"""Complete tiles of a chain's Merkle tree (store/chain/tree_tiles.py), on a real LevelDB:
written once by the append that completes them, holding exactly their nodes, and read
by proofs in their nodes' place; a tile that is not stored is read as its nodes."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from store.backends.contract import Lanes
from store.backends.leveldb import LevelDBLaneStore
from store.chain.checkpoints import CheckpointSigner
from store.chain.evidence import EvidenceChain
from store.chain.head import format_timestamp
from store.chain.keys import tile_key, tree_key
from store.chain.log_note import LogSigner, current_note
from store.chain.log_proofs import consistency, inclusion
from store.chain.merkle_tree import NodeId, entry_leaf, root
from store.chain.rfc9162 import verify_consistency, verify_inclusion
from store.chain.tree_store import StoredTree
from store.chain.tree_tiles import (
    NODES,
    TileId,
    complete,
    completed_tiles,
    nodes_of,
    offset_in,
    tile_of,
    tiles_below,
)
from store.secrets import SecretsHome
from tests.support.counting_lanes import CountingLanes

CHAIN = "tenant-a"


def body(n: int) -> dict[str, Any]:
    moment = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=n)
    return {"recorded_at": format_timestamp(moment), "decision": f"d{n}"}


def fake(seq: int) -> bytes:
    return b'{"seq":%d}' % seq


def grown(lanes: Lanes, size: int, rng: random.Random) -> StoredTree:
    """A tree of `size` fake leaves, appended in batches of 1 to 300 as the journal would."""
    with lanes.batch(sync=True) as batch:
        batch.put(tree_key(CHAIN), b"")
    tree, at = StoredTree(lanes, CHAIN), 0
    while at < size:
        count = min(rng.randint(1, 300), size - at)
        nodes = tree.appended(at, (fake(seq) for seq in range(at + 1, at + count + 1)))
        with lanes.batch(sync=False) as batch:
            tree.put(batch, nodes)
            tree.put_tiles(batch, completed_tiles(nodes), nodes)  # as the note's signing does
        at += count
    return tree


def test_a_tiles_nodes_are_placed_level_by_level() -> None:
    tile = TileId(1, 3)
    members = list(nodes_of(tile))
    assert len(members) == NODES == 510
    assert [offset_in(node, tile_of(node)) for node in members] == [32 * n for n in range(NODES)]
    assert all(tile_of(node) == tile for node in members)
    assert members[0] == NodeId(8, 3 * 256) and members[-1] == NodeId(15, 7)
    assert not complete(tile, 4 * 65536 - 1) and complete(tile, 4 * 65536)


def test_complete_tiles_hold_their_nodes_and_proofs_read_them(lanes: LevelDBLaneStore) -> None:
    rng = random.Random(30)
    tree = grown(lanes, 70_000, rng)
    for tile in (TileId(0, 0), TileId(0, 272), TileId(1, 0)):
        stored = lanes.get(tile_key(CHAIN, tile))
        assert stored == b"".join(tree.node_at(*node) for node in nodes_of(tile))
    assert lanes.get(tile_key(CHAIN, TileId(0, 273))) is None  # not complete yet
    assert lanes.get(tile_key(CHAIN, TileId(1, 1))) is None
    counting = CountingLanes(lanes)
    chain = EvidenceChain(counting, CHAIN)  # type: ignore[arg-type]
    for _ in range(200):
        size = rng.randint(2, 70_000)
        seq = rng.randint(1, size)
        head = root(size, tree.node_at)
        counting.got = 0
        proof = inclusion(chain, seq, fake(seq), size, 70_000)
        assert counting.got < len(proof.hashes) + 1 or size < 256  # tiles, not each node
        assert verify_inclusion(seq - 1, size, entry_leaf(fake(seq)), proof.hashes, head)
        extends = consistency(chain, seq, size, 70_000)
        assert verify_consistency(seq, size, root(seq, tree.node_at), head, extends.hashes)


def test_signing_a_note_writes_the_tiles_its_tree_completed_on_both_backends(
    lanes_on_both: Lanes, tmp_path: Path
) -> None:
    """Appends write nodes only; the note's signing, which checks the nodes added since the
    last note, writes the tiles they complete, and proofs against the note read them."""
    chain = EvidenceChain(lanes_on_both, CHAIN)
    log, now = LogSigner.of(SecretsHome.local(tmp_path), None), datetime.now(UTC)
    tree = StoredTree(lanes_on_both, CHAIN)
    for size in (300, 700):
        while (at := chain.head().seq) < size:
            chain.append([body(n) for n in range(at + 1, min(at + 37, size) + 1)])
        assert lanes_on_both.get(tile_key(CHAIN, TileId(0, size // 256 - 1))) is None
        note = current_note(chain, SecretsHome.local(tmp_path), log, now)
        assert note.head.size == size
        for tile in [TileId(0, n) for n in range(size // 256)]:
            stored = lanes_on_both.get(tile_key(CHAIN, tile))
            assert stored == b"".join(tree.node_at(*node) for node in nodes_of(tile))
    assert lanes_on_both.get(tile_key(CHAIN, TileId(0, 2))) is None  # not complete
    counting = CountingLanes(lanes_on_both)
    proving = EvidenceChain(counting, CHAIN)  # type: ignore[arg-type]
    stored = dict(chain.stored_entries(until_seq=700))
    for seq in (1, 255, 256, 300, 511, 512, 700):
        counting.got = 0
        proof = inclusion(proving, seq, stored[seq], 700, 700)
        if seq <= 512:  # in a complete tile: read as it, not node by node
            assert counting.got < len(proof.hashes), seq
        leaf = entry_leaf(stored[seq])
        assert verify_inclusion(seq - 1, 700, leaf, proof.hashes, note.head.root_hash)


def test_a_tile_not_stored_is_read_as_its_nodes(lanes: LevelDBLaneStore) -> None:
    tree = grown(lanes, 600, random.Random(1))
    with lanes.batch(sync=True) as batch:  # as a tree built before tiles
        batch.delete(tile_key(CHAIN, TileId(0, 0)))
        batch.delete(tile_key(CHAIN, TileId(0, 1)))
    chain = EvidenceChain(lanes, CHAIN)
    for seq in (1, 255, 256, 257, 512, 600):
        proof = inclusion(chain, seq, fake(seq), 600, 600)
        head = root(600, tree.node_at)
        assert verify_inclusion(seq - 1, 600, entry_leaf(fake(seq)), proof.hashes, head)


def test_retention_deletes_the_tiles_below_the_first_kept_leaf(lanes: LevelDBLaneStore) -> None:
    tree = grown(lanes, 70_000, random.Random(7))
    heads = {size: root(size, tree.node_at) for size in (66_000, 70_000)}
    for before, after in ((0, 600), (600, 65_600)):
        with lanes.batch(sync=True) as batch:
            tree.prune(batch, before, after)
        assert list(tiles_below(before, after))
        for tile in tiles_below(before, after):
            assert lanes.get(tile_key(CHAIN, tile)) is None
    assert lanes.get(tile_key(CHAIN, TileId(0, 256))) is not None  # leaves 65,536 to 65,791
    chain = EvidenceChain(lanes, CHAIN)
    for seq in (65_601, 65_792, 66_000, 69_999):
        for size in heads:
            if seq <= size:
                proof = inclusion(chain, seq, fake(seq), size, 70_000)
                leaf = entry_leaf(fake(seq))
                assert verify_inclusion(seq - 1, size, leaf, proof.hashes, heads[size])


def test_a_note_first_signed_after_retention_skips_the_tile_retention_cut(
    lanes: LevelDBLaneStore, tmp_path: Path
) -> None:
    """Retention pruned inside a tile before any note: the first note's signing cannot build
    that tile (its lower nodes are gone), and signs anyway; proofs read the kept nodes."""
    chain = EvidenceChain(lanes, CHAIN)
    chain.append([body(n) for n in range(1, 701)])
    start = datetime(2025, 1, 1, tzinfo=UTC)
    signer = CheckpointSigner.of(SecretsHome.local(tmp_path))
    assert chain.prune(start + timedelta(seconds=300), signer, start + timedelta(days=1)) > 256
    note = current_note(
        chain,
        SecretsHome.local(tmp_path),
        LogSigner.of(SecretsHome.local(tmp_path), None),
        datetime.now(UTC),
    )
    assert note.head.size == 700 and StoredTree(lanes, CHAIN).present()
    assert lanes.get(tile_key(CHAIN, TileId(0, 1))) is None  # cut by retention: not written
    stored = dict(chain.stored_entries(until_seq=700))
    for seq in (chain.anchor().seq + 1, 512, 700):
        proof = inclusion(chain, seq, stored[seq], 700, 700)
        leaf = entry_leaf(stored[seq])
        assert verify_inclusion(seq - 1, 700, leaf, proof.hashes, note.head.root_hash)
