"""The stored Merkle tree (`store.chain.merkle_tree`) against the tests' own RFC 6962 reference
(tests/support/rfc6962_reference.py): the same heads and proofs for every small tree, proofs
the standard-library verifiers (`store.chain.rfc9162`) accept and refuse once any bit is
flipped, and reads and writes that grow with log2 of the tree, not with it."""

from __future__ import annotations

import ast
import math
import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.chain import rfc9162
from store.chain.merkle_tree import (
    NodeId,
    appended_all,
    consistency_proof,
    entry_leaf,
    inclusion_proof,
    node_name,
    root,
)
from store.chain.rfc9162 import EMPTY_ROOT, verify_consistency, verify_inclusion
from tests.support import rfc6962_reference as ref
from tests.support.merkle_nodes import Nodes, leaf_inputs

MAX_SIZE = 70
MAX_CONSISTENT = 40
INPUTS = leaf_inputs(MAX_SIZE)
TREE = Nodes().extend(INPUTS)  # sizes below it are read from it: proofs of older heads
ROOTS = [ref.mth(INPUTS[:size]) for size in range(MAX_SIZE + 1)]


def flipped(hashes: list[bytes], rng: random.Random) -> list[bytes]:
    """hashes with one random bit of one of them flipped."""
    at = rng.randrange(len(hashes))
    bit = rng.randrange(8 * len(hashes[at]))
    changed = bytearray(hashes[at])
    changed[bit // 8] ^= 1 << (bit % 8)
    return [*hashes[:at], bytes(changed), *hashes[at + 1 :]]


def test_the_empty_tree_and_one_leaf() -> None:
    assert root(0, TREE.node_at) == EMPTY_ROOT == ref.mth([])
    assert root(1, TREE.node_at) == entry_leaf(INPUTS[0]) == ref.mth(INPUTS[:1])


@pytest.mark.parametrize("size", range(MAX_SIZE + 1))
def test_every_head_and_inclusion_proof_is_the_references(size: int) -> None:
    rng = random.Random(size)
    assert root(size, TREE.node_at) == ROOTS[size]
    for index in range(size):
        proof = inclusion_proof(index, size, TREE.node_at)
        assert proof == ref.path(index, INPUTS[:size])
        leaf = entry_leaf(INPUTS[index])
        assert verify_inclusion(index, size, leaf, proof, ROOTS[size])
        if proof:
            assert not verify_inclusion(index, size, leaf, flipped(proof, rng), ROOTS[size])
            assert not verify_inclusion(index, size, leaf, proof[:-1], ROOTS[size])
            if size < MAX_SIZE:  # a proof of an older head is no proof of the next one
                assert not verify_inclusion(index, size + 1, leaf, proof, ROOTS[size + 1])
        assert not verify_inclusion(index, size, leaf, [*proof, leaf], ROOTS[size])
        assert not verify_inclusion(index, size, flipped([leaf], rng)[0], proof, ROOTS[size])
        assert not verify_inclusion(index, size, leaf, proof, flipped([ROOTS[size]], rng)[0])
        if size > 1:
            assert not verify_inclusion(index ^ 1, size, leaf, proof, ROOTS[size])


@pytest.mark.parametrize("second", range(1, MAX_CONSISTENT + 1))
def test_every_consistency_proof_is_the_references(second: int) -> None:
    rng = random.Random(second)
    for first in range(1, second + 1):
        proof = consistency_proof(first, second, TREE.node_at)
        assert proof == ref.proof(first, INPUTS[:second])
        roots = ROOTS[first], ROOTS[second]
        assert verify_consistency(first, second, *roots, proof)
        if proof:
            assert not verify_consistency(first, second, *roots, flipped(proof, rng))
            assert not verify_consistency(first, second, *roots, proof[:-1])
            assert not verify_consistency(first, second, *roots, [*proof, proof[0]])
        other = rng.randrange(1, MAX_SIZE + 1)
        if other != second:
            assert not verify_consistency(first, other, ROOTS[first], ROOTS[other], proof)
        assert not verify_consistency(
            first, second, ROOTS[first], flipped([ROOTS[second]], rng)[0], proof
        )
        assert not verify_consistency(
            first, second, flipped([ROOTS[first]], rng)[0], ROOTS[second], proof
        )


def test_bad_sizes_are_refused() -> None:
    for index, size in [(0, 0), (3, 3), (-1, 3)]:
        with pytest.raises(ValueError):
            inclusion_proof(index, size, TREE.node_at)
        assert not verify_inclusion(index, size, ROOTS[1], [], ROOTS[1])
    for first, second in [(0, 5), (0, 0), (6, 5), (-1, 5)]:
        with pytest.raises(ValueError):
            consistency_proof(first, second, TREE.node_at)
        assert not verify_consistency(first, second, EMPTY_ROOT, ROOTS[5], [])
    with pytest.raises(ValueError):
        root(-1, TREE.node_at)


def test_a_batch_writes_what_appending_one_by_one_writes() -> None:
    for cut in (0, 1, 5, 32, 33):
        start = Nodes().extend(INPUTS[:cut])
        start.counted()
        batch = appended_all(cut, (entry_leaf(data) for data in INPUTS[cut:]), start.node_at)
        assert {**start.stored, **batch} == TREE.stored
        assert start.counted() <= cut.bit_length()  # the old frontier only, read once each


def test_node_names_sort_by_level_then_index() -> None:
    nodes = [NodeId(level, index) for level in (0, 1, 7) for index in (0, 1, 255, 256, 2**40)]
    assert sorted(nodes, key=node_name) == sorted(nodes)
    assert len({node_name(node) for node in nodes}) == len(nodes)


def bound(size: int) -> float:
    """c * log2(n) + c with c = 2: what a proof may read."""
    return 2 * math.log2(max(size, 1)) + 2


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=2, max_value=3000), st.data())
def test_reads_and_writes_grow_with_log2_of_the_tree(size: int, data: st.DataObject) -> None:
    tree = Nodes()
    inputs = leaf_inputs(size)
    for data_ in inputs:
        tree.counted()
        tree.append(data_)
        assert tree.writes <= math.log2(tree.size) + 2
        assert tree.counted() <= math.log2(tree.size) + 1
    tree_size = data.draw(st.integers(min_value=1, max_value=size), label="tree_size")
    index = data.draw(st.integers(min_value=0, max_value=tree_size - 1), label="index")
    first = data.draw(st.integers(min_value=1, max_value=tree_size), label="first")
    head = root(tree_size, tree.node_at)
    assert tree.counted() <= bound(tree_size)
    proof = inclusion_proof(index, tree_size, tree.node_at)
    assert tree.counted() <= bound(tree_size)
    assert verify_inclusion(index, tree_size, entry_leaf(inputs[index]), proof, head)
    old = root(first, tree.node_at)
    consistency = consistency_proof(first, tree_size, tree.node_at)
    tree.counted()
    assert verify_consistency(first, tree_size, old, head, consistency)
    consistency_proof(first, tree_size, tree.node_at)
    assert tree.counted() <= bound(tree_size) + 1


def test_the_verifiers_need_python_3_8_and_its_standard_library_alone() -> None:
    """The offline bundle verifier can ship `store.chain.rfc9162` as it is."""
    source = Path(rfc9162.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {
        name.name for node in ast.walk(tree) if isinstance(node, ast.Import) for name in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "hashlib", "collections.abc"}
    assert all(name.split(".")[0] in sys.stdlib_module_names for name in imported)
