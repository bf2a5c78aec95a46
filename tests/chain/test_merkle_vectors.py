"""Known answers from a tree nobody here wrote: `github.com/transparency-dev/merkle`'s RFC 6962
test vectors (tests/chain/data/transparency_dev_merkle.json, which names the commit and
files they were taken from): the node and root hashes of its eight reference leaves, and
every inclusion and consistency probe it publishes, each verifying exactly when it says
(but for roots that are not 32 bytes, which never verify here)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from store.chain.merkle_tree import NodeId, consistency_proof, entry_leaf, inclusion_proof, root
from store.chain.rfc9162 import EMPTY_ROOT, HASH_SIZE, verify_consistency, verify_inclusion
from tests.support.merkle_nodes import Nodes
from tests.support.paths import ROOT

VECTORS = json.loads(
    (ROOT / "tests" / "chain" / "data" / "transparency_dev_merkle.json").read_text()
)
LEAVES = [bytes.fromhex(leaf) for leaf in VECTORS["leaf_inputs"]]
TREE = Nodes().extend(LEAVES)


def b64(value: str | None) -> bytes:
    return base64.b64decode(value or "")


def hashes(values: list[str] | None) -> list[bytes]:
    return [b64(value) for value in values or []]


def named(kind: str) -> list[Any]:
    return [pytest.param(probe, id=probe["file"]) for probe in VECTORS[kind]]


def test_the_reference_tree_stores_the_published_nodes() -> None:
    published = {
        NodeId(level, index): bytes.fromhex(node)
        for level, nodes in enumerate(VECTORS["node_hashes"])
        for index, node in enumerate(nodes)
    }
    assert TREE.stored == published


def test_every_head_is_the_published_root() -> None:
    assert VECTORS["root_hashes"][0] == EMPTY_ROOT.hex()
    for size, expected in enumerate(VECTORS["root_hashes"]):
        assert root(size, TREE.node_at).hex() == expected


@pytest.mark.parametrize("probe", named("inclusion"))
def test_inclusion_probes(probe: dict[str, Any]) -> None:
    index, size, proof = probe["leafIdx"], probe["treeSize"], hashes(probe["proof"])
    leaf, head = b64(probe["leafHash"]), b64(probe["root"])
    assert verify_inclusion(index, size, leaf, proof, head) is not probe["wantErr"]
    if not probe["wantErr"] and head == root(size, TREE.node_at):  # a probe of the reference tree
        assert leaf == entry_leaf(LEAVES[index])
        assert inclusion_proof(index, size, TREE.node_at) == proof


@pytest.mark.parametrize("probe", named("consistency"))
def test_consistency_probes(probe: dict[str, Any]) -> None:
    first, second, proof = probe["size1"], probe["size2"], hashes(probe["proof"])
    roots = b64(probe["root1"]), b64(probe["root2"])
    # One deliberate difference: a "root" that is no SHA-256 hash proves nothing here, even
    # between equal sizes, where transparency-dev compares any two roots byte for byte.
    valid = not probe["wantErr"] and all(len(value) == HASH_SIZE for value in roots)
    assert verify_consistency(first, second, *roots, proof) is valid
    if not probe["wantErr"] and roots[1] == root(second, TREE.node_at):
        assert roots[0] == root(first, TREE.node_at)
        assert consistency_proof(first, second, TREE.node_at) == proof


def test_the_happy_paths_are_proofs_of_the_reference_tree() -> None:
    """The comparisons above are not vacuous: the published happy paths are of this tree."""
    happy = [
        probe
        for kind in ("inclusion", "consistency")
        for probe in VECTORS[kind]
        if not probe["wantErr"]
    ]
    heads = {root(size, TREE.node_at) for size in range(len(LEAVES) + 1)}
    ours = [probe for probe in happy if b64(probe.get("root") or probe.get("root2")) in heads]
    assert len(ours) >= 9
