"""Real LevelDB stores, damaged the way disks and crashes damage them; and decision chains\nrewritten the way whoever holds the data dir can rewrite them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plyvel

from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_digest, canonical_json
from store.chain.entry import parse_entry
from store.chain.evidence import EvidenceChain
from store.chain.keys import entry_key
from store.key_codec import LaneKey, TenantResourceLane

CANARY = "DAMAGE-CANARY-4e1b"
BLOCK = 32768


def build_store(path: Path, *, chain_entries: int = 5, sessions: int = 5) -> None:
    """Chain entries, then session records, each write one log record, all still in the log."""
    lanes = LevelDBLaneStore(path)
    chain = EvidenceChain(lanes)
    for n in range(1, chain_entries + 1):
        chain.append([{"recorded_at": f"2025-01-01T00:00:{n:02d}Z", "decision": f"{CANARY}-{n}"}])
    for n in range(sessions):
        key = LaneKey(TenantResourceLane.SESSION_STATE, CANARY, "ws", f"s{n}")
        lanes.put(key, f"{CANARY}-{n}".encode() * 10)
    lanes.close()


def into_table(path: Path) -> Path:
    """Compact everything into table files; the one table."""
    db = plyvel.DB(str(path))
    db.compact_range()
    db.close()
    (table,) = path.glob("*.ldb")
    return table


def newest_log(path: Path) -> Path:
    return max(path.glob("*.log"), key=lambda log: int(log.stem))


def flip(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


def record_offsets(log: bytes) -> list[int]:
    """Where each record of a log's first block starts (its records are whole ones)."""
    offsets, offset = [], 0
    while offset + 7 <= min(len(log), BLOCK):
        offsets.append(offset)
        offset += 7 + (log[offset + 4] | log[offset + 5] << 8)
    return offsets


def set_record_type(log_file: Path, index: int, kind: int) -> None:
    """Give record index of the log an unknown type: its CRC fails too."""
    data = bytearray(log_file.read_bytes())
    data[record_offsets(bytes(data))[index] + 6] = kind
    log_file.write_bytes(bytes(data))


def stored(chain: EvidenceChain, seq: int) -> dict[str, Any]:
    """The chain's entry of `seq`, as stored."""
    entry = parse_entry(chain.lanes.get(entry_key(seq, chain.name)) or b"")
    assert entry is not None
    return entry


def rewrite(chain: EvidenceChain, seq: int, entry: dict[str, Any]) -> None:
    chain.lanes.put(entry_key(seq, chain.name), canonical_json(entry))


def rehashed(entry: dict[str, Any], **changes: Any) -> dict[str, Any]:
    content = {k: v for k, v in entry.items() if k != "hash"} | changes
    return content | {"hash": canonical_digest(content)}


def rechained(chain: EvidenceChain, first: int, last: int, **changes: Any) -> None:
    """An attacker's rewrite of first..last with every hash and link recomputed."""
    prev = stored(chain, first)["prev_hash"]
    for seq in range(first, last + 1):
        entry = rehashed(stored(chain, seq) | {"prev_hash": prev}, **changes)
        rewrite(chain, seq, entry)
        prev = entry["hash"]
