"""A chain's Merkle tree as the store keeps it: written with its entries, in O(log n) reads,
the tree of RFC 6962 over the entries' stored bytes; built by `db upgrade`, pruned by retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from store.backends.leveldb import LevelDBLaneStore
from store.chain.checkpoints import CheckpointSigner
from store.chain.evidence import EvidenceChain
from store.chain.head import format_timestamp
from store.chain.keys import entry_key, tree_key
from store.chain.merkle_retention import prunable
from store.chain.merkle_tree import inclusion_proof, root
from store.chain.tree_build import TreeBuild, build_tree
from store.chain.tree_store import StoredTree
from store.key_codec import TenantResourceLane
from tests.support import rfc6962_reference as reference
from tests.support.counting_lanes import CountingLanes

T0 = datetime(2025, 1, 1, tzinfo=UTC)
CHAIN = "tenant-a"


def body(n: int) -> dict[str, Any]:
    return {"recorded_at": format_timestamp(T0 + timedelta(minutes=n)), "decision": f"d{n}"}


def stored_entries(lanes: LevelDBLaneStore, count: int) -> list[bytes]:
    found = [lanes.get(entry_key(seq, CHAIN)) for seq in range(1, count + 1)]
    assert all(value is not None for value in found)
    return [value for value in found if value is not None]


def test_each_append_writes_the_tree_in_log_n_reads(lanes: LevelDBLaneStore) -> None:
    counting = CountingLanes(lanes)
    chain = EvidenceChain(counting, CHAIN)  # type: ignore[arg-type]
    tree = StoredTree(lanes, CHAIN)
    for n in range(1, 130):
        chain.head()  # the journal knows its head; only the append's own reads are counted
        counting.got = 0
        chain.append([body(n)])
        # the tree key, the entry's expected absence is no read; the frontier: log2(n)
        assert counting.got <= 1 + max(1, (n - 1).bit_length()) + 1, n
        leaves = stored_entries(lanes, n)
        assert root(n, tree.node_at) == reference.mth(leaves)
    leaves = stored_entries(lanes, 129)
    assert inclusion_proof(77, 129, tree.node_at) == reference.path(77, leaves)


def test_a_batch_of_entries_sees_its_own_nodes(lanes: LevelDBLaneStore) -> None:
    chain = EvidenceChain(lanes, CHAIN)
    chain.append([body(n) for n in range(1, 6)])
    chain.append([body(n) for n in range(6, 40)])
    leaves = stored_entries(lanes, 39)
    assert root(39, StoredTree(lanes, CHAIN).node_at) == reference.mth(leaves)


def test_db_upgrade_builds_the_tree_and_appends_go_on(lanes: LevelDBLaneStore) -> None:
    chain = EvidenceChain(lanes, CHAIN)
    chain.append([body(n) for n in range(1, 20)])
    with lanes.batch(sync=True) as batch:  # a chain written before trees
        for key, _ in lanes.scan(TenantResourceLane.MERKLE_NODE, CHAIN):
            batch.delete(key)
        batch.delete(tree_key(CHAIN))
    chain.append([body(20)])  # no tree: no nodes
    assert not list(lanes.scan(TenantResourceLane.MERKLE_NODE, CHAIN))
    assert build_tree(lanes, CHAIN) is TreeBuild.BUILT
    assert build_tree(lanes, CHAIN) is TreeBuild.PRESENT
    chain.append([body(21)])
    assert root(21, StoredTree(lanes, CHAIN).node_at) == reference.mth(stored_entries(lanes, 21))


def test_retention_keeps_what_proofs_of_kept_leaves_need(lanes: LevelDBLaneStore) -> None:
    chain = EvidenceChain(lanes, CHAIN)
    chain.append([body(n) for n in range(1, 101)])
    leaves = stored_entries(lanes, 100)
    signer = CheckpointSigner(b"\x07" * 32)
    before = len(list(lanes.scan(TenantResourceLane.MERKLE_NODE, CHAIN)))
    assert chain.prune(T0 + timedelta(minutes=38), signer, T0 + timedelta(days=1)) == 37
    tree = StoredTree(lanes, CHAIN)
    dropped = sum(stop - start for _, start, stop in prunable(0, 37))
    assert dropped > 30
    assert len(list(lanes.scan(TenantResourceLane.MERKLE_NODE, CHAIN))) == before - dropped
    for index in (37, 50, 99):
        assert inclusion_proof(index, 100, tree.node_at) == reference.path(index, leaves)
    assert root(37, tree.node_at) == reference.mth(leaves[:37])
    chain.append([body(101)])
    newest = lanes.get(entry_key(101, CHAIN))
    assert newest is not None
    assert root(101, tree.node_at) == reference.mth([*leaves, newest])
    assert build_tree(lanes, CHAIN) is TreeBuild.PRESENT
