"""Retention's cut of the Merkle tree (`store.chain.merkle_retention`): once the nodes it names
are deleted, every head of a kept size, every inclusion proof of a kept leaf and every
consistency proof between kept sizes is still the reference's, and appends go on; no node
it keeps could go too."""

from __future__ import annotations

import itertools

import pytest

from store.chain.merkle_retention import NodeRange, prunable
from store.chain.merkle_tree import NodeId, consistency_proof, inclusion_proof, root
from tests.support import rfc6962_reference as ref
from tests.support.merkle_nodes import Nodes, leaf_inputs

SIZE = 40
INPUTS = leaf_inputs(SIZE + 3)


def pruned(tree: Nodes, ranges: list[NodeRange]) -> None:
    for level, start, stop in ranges:
        for index in range(start, stop):
            del tree.stored[NodeId(level, index)]  # KeyError: named twice, or never stored


def asks(tree: Nodes, kept_from: int) -> None:
    """Everything still asked of a tree that keeps leaves from kept_from on."""
    for size in range(max(kept_from, 1), tree.size + 1):
        assert root(size, tree.node_at) == ref.mth(INPUTS[:size])
        for index in range(kept_from, size):
            assert inclusion_proof(index, size, tree.node_at) == ref.path(index, INPUTS[:size])
        for first in range(max(kept_from, 1), size + 1):
            expected = ref.proof(first, INPUTS[:size])
            assert consistency_proof(first, size, tree.node_at) == expected


@pytest.mark.parametrize("kept_from", range(SIZE + 1))
def test_what_is_kept_answers_every_proof_still_asked(kept_from: int) -> None:
    tree = Nodes().extend(INPUTS[:SIZE])
    pruned(tree, prunable(0, kept_from))
    asks(tree, kept_from)
    tree.extend(INPUTS[SIZE:])  # appends after the cut read only what it kept
    asks(tree, kept_from)


@pytest.mark.parametrize("kept_from", range(1, SIZE + 1))
def test_nothing_kept_below_the_cut_could_go(kept_from: int) -> None:
    """Each node wholly below kept_from that stays is the head of some kept size's proofs:
    at most one per level, the complete subtrees the first kept_from leaves are made of."""
    tree = Nodes().extend(INPUTS[:SIZE])
    pruned(tree, prunable(0, kept_from))
    below = {node for node in tree.stored if (node.position + 1) << node.level <= kept_from}
    levels = [node.level for node in below]
    assert len(levels) == len(set(levels)) == bin(kept_from).count("1")
    for node in below:
        value = tree.stored.pop(node)
        with pytest.raises(KeyError):
            root(kept_from, tree.node_at)
        tree.stored[node] = value


def test_pruning_in_steps_drops_what_pruning_at_once_does() -> None:
    steps = [0, 1, 2, 3, 7, 8, 9, 16, 31, 33, 40]
    at_once = Nodes().extend(INPUTS[:SIZE])
    pruned(at_once, prunable(0, SIZE))
    stepped = Nodes().extend(INPUTS[:SIZE])
    for before, after in itertools.pairwise(steps):
        pruned(stepped, prunable(before, after))
    assert stepped.stored == at_once.stored
    assert prunable(9, 9) == []
    with pytest.raises(ValueError):
        prunable(10, 9)
