"""Where a decision chain lives in the store: its keys, and which chains the store holds.

A chain's entries, its anchor and its marker are keys whose tenant component is
the chain's name (the tenant id), so on PostgreSQL a chain lives under its
tenant's `tenant_id`. Entries that name no tenant go on the chain
`NO_TENANT_CHAIN`, a name no scope id can be; what the deployment records of
itself (policy activations) goes on `SYSTEM_CHAIN`. Its Merkle tree's nodes are keys of
their own lane (`node_key`), under the chain's name too, and `tree_key` says
the tree covers every leaf of the chain. The name `""`
(`LEGACY_CHAIN`) addresses the one global chain older versions wrote, which
`sessionstate db upgrade` migrates (`service.decisions.migration`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache

from store.backends.contract import Lanes, LaneView
from store.chain.head import CHAIN_NAME_PATTERN, NO_TENANT_CHAIN, SYSTEM_CHAIN
from store.chain.merkle_tree import NodeId, node_name
from store.chain.tree_tiles import TileId, tile_name
from store.key_codec import LaneKey, TenantResourceLane, successor

LEGACY_CHAIN = ""  # the single global chain of versions before per-tenant chains
SEQ_BYTES = 8  # an entry's key name: its seq, big-endian
LAST_SEQ = (1 << (8 * SEQ_BYTES)) - 1
_CHAIN_NAME_RE = re.compile(CHAIN_NAME_PATTERN)


def chain_name(tenant_id: str | None) -> str:
    """The chain a decision about tenant_id goes on: the tenant's, else `NO_TENANT_CHAIN`."""
    return tenant_id or NO_TENANT_CHAIN


def is_chain_name(name: str) -> bool:
    """Whether name can be a (current) chain: a scope id or `NO_TENANT_CHAIN`."""
    return _CHAIN_NAME_RE.fullmatch(name) is not None


def entry_key(seq: int, chain: str = NO_TENANT_CHAIN) -> LaneKey:
    """The key of entry seq of a chain: 8 bytes big-endian, so key order is seq order."""
    return LaneKey(TenantResourceLane.TRACE_EVIDENCE, chain, name=seq.to_bytes(SEQ_BYTES, "big"))


def anchor_key(chain: str) -> LaneKey:
    """Where retention keeps the chain's start (the last pruned entry's seq and hash)."""
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=b"anchor")


ANCHOR_KEY = anchor_key(NO_TENANT_CHAIN)  # the no-tenant chain's anchor


def marker_key(chain: str) -> LaneKey:
    """Says the chain exists; written with its first entry, so chains can be listed."""
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=b"chain")


def node_key(chain: str, node: NodeId) -> LaneKey:
    """Where node `node` of the chain's Merkle tree is kept (`merkle_tree.node_name`)."""
    return LaneKey(TenantResourceLane.MERKLE_NODE, chain, name=node_name(node))


def meta_newest_first(
    view: LaneView, chain: str, prefix: bytes, suffix_bytes: int
) -> Iterator[tuple[LaneKey, bytes]]:
    """The chain's `trace_meta` keys named `prefix` then `suffix_bytes` more bytes (a size,
    big-endian, then what else the name holds), largest name first: one seek. Names are
    length-prefixed in keys, so the bounds are as long as the names."""
    lane = TenantResourceLane.TRACE_META
    stop = successor(prefix)
    assert stop is not None  # a prefix of letters
    return view.scan(
        lane,
        chain,
        "",
        "",
        reverse=True,
        start=LaneKey(lane, chain, name=prefix + bytes(suffix_bytes)),
        stop=LaneKey(lane, chain, name=stop + bytes(suffix_bytes)),
    )


def tile_key(chain: str, tile: TileId) -> LaneKey:
    """Where a complete tile of the chain's Merkle tree is kept (`tree_tiles.tile_name`),
    beside its nodes."""
    return LaneKey(TenantResourceLane.MERKLE_NODE, chain, name=tile_name(tile))


@lru_cache(maxsize=4096)  # read or expected by every append: one per chain, immutable
def tree_key(chain: str) -> LaneKey:
    """Says the chain's Merkle tree holds a leaf for every entry from seq 1 on: written with
    the chain's first entries, or by `sessionstate db upgrade` once it built the tree."""
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=b"tree")


def chain_names(lanes: Lanes) -> list[str]:
    """Every chain with a marker, in key order (the legacy chain is never listed)."""
    return [
        key.tenant
        for key, _ in lanes.scan(TenantResourceLane.TRACE_META)
        if key.name == b"chain" and key.tenant != LEGACY_CHAIN
    ]


def tenant_chain_names(lanes: Lanes) -> list[str]:
    """Every chain of decisions (each tenant's, and the no-tenant one): all but the
    deployment's own, `SYSTEM_CHAIN` (its policy activations)."""
    return [name for name in chain_names(lanes) if name != SYSTEM_CHAIN]


def legacy_chain_present(lanes: Lanes) -> bool:
    """Whether the data holds the single global chain of older versions (not migrated yet)."""
    if next(iter(lanes.scan(TenantResourceLane.TRACE_EVIDENCE, LEGACY_CHAIN)), None) is not None:
        return True
    return lanes.get(anchor_key(LEGACY_CHAIN)) is not None
