"""The tree's frontier a writer keeps after each commit: the next append reads nothing of
the tree, and writes the nodes a cold append would; a frontier of another head is unused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from store.backends.leveldb import LevelDBLaneStore
from store.chain.evidence import EvidenceChain
from store.chain.head import ChainHead, format_timestamp
from store.chain.keys import LAST_SEQ, tree_key
from store.chain.merkle_tree import NodeId, root
from store.chain.tree_frontier import TreeFrontier, edge
from store.chain.tree_store import StoredTree
from store.key_codec import TenantResourceLane
from tests.support import rfc6962_reference as reference
from tests.support.counting_lanes import CountingLanes

T0 = datetime(2025, 1, 1, tzinfo=UTC)
CHAIN = "tenant-a"


def body(n: int) -> dict[str, Any]:
    return {"recorded_at": format_timestamp(T0 + timedelta(minutes=n)), "decision": f"d{n}"}


def leaves(lanes: LevelDBLaneStore) -> list[bytes]:
    return [value for _, value in EvidenceChain(lanes, CHAIN).stored_entries(until_seq=LAST_SEQ)]


def test_the_edge_is_the_complete_subtrees_the_leaves_are_made_of() -> None:
    for size in range(0, 300):
        covered = 0
        for node in edge(size):  # largest first, each starting where the last ended
            assert node.position << node.level == covered
            covered += 1 << node.level
        assert covered == size
    assert edge(6) == [NodeId(2, 0), NodeId(1, 2)]


def append(
    chain: EvidenceChain, lanes: Any, head: ChainHead, n: int, known: TreeFrontier | None
) -> tuple[ChainHead, TreeFrontier | None]:
    extension = chain.extension(after=head, known=known)
    extension.seal([body(i) for i in range(n, n + 1 + n % 3)])
    with lanes.batch(sync=True) as batch:
        extension.add_to(batch)
    return extension.head, extension.frontier


def test_appends_on_a_kept_frontier_read_nothing_of_the_tree(lanes: LevelDBLaneStore) -> None:
    counting = CountingLanes(lanes)
    chain = EvidenceChain(counting, CHAIN)  # type: ignore[arg-type]
    head, frontier = append(chain, lanes, chain.head(), 1, None)
    for n in range(2, 120):
        counting.got = 0
        head, frontier = append(chain, lanes, head, n, frontier)
        assert counting.got == 0, n
        assert frontier is not None and frontier.head == head
        stored = StoredTree(lanes, CHAIN)
        assert frontier.nodes == {node: stored.node_at(*node) for node in edge(head.seq)}
    assert root(head.seq, StoredTree(lanes, CHAIN).node_at) == reference.mth(leaves(lanes))


def test_a_frontier_of_another_head_is_not_used(lanes: LevelDBLaneStore) -> None:
    chain = EvidenceChain(lanes, CHAIN)
    head, frontier = append(chain, lanes, chain.head(), 1, None)
    assert frontier is not None
    other = ChainHead(seq=head.seq, hash="sha256:" + "0" * 64)  # the same size, another chain
    stale = TreeFrontier(other, frontier.marker, dict.fromkeys(frontier.nodes, bytes(32)))
    assert not stale.usable_after(head)
    head, _ = append(chain, lanes, head, 2, stale)  # its nodes unused: read from the store
    assert root(head.seq, StoredTree(lanes, CHAIN).node_at) == reference.mth(leaves(lanes))


def test_a_kept_frontier_without_a_tree_adds_no_nodes(lanes: LevelDBLaneStore) -> None:
    chain = EvidenceChain(lanes, CHAIN)
    head, _ = append(chain, lanes, chain.head(), 1, None)
    with lanes.batch(sync=True) as batch:  # a chain written before trees
        for key, _ in lanes.scan(TenantResourceLane.MERKLE_NODE, CHAIN):
            batch.delete(key)
        batch.delete(tree_key(CHAIN))
    head, frontier = append(chain, lanes, head, 2, None)
    assert frontier == TreeFrontier(head, None, {})
    head, frontier = append(chain, lanes, head, 3, frontier)
    assert frontier == TreeFrontier(head, None, {})
    assert not list(lanes.scan(TenantResourceLane.MERKLE_NODE, CHAIN))
