"""The one key codec: `TenantResourceLane` prefixes and length-prefixed components.

A key is `<lane>\\x00` followed by tenant, workspace, session and name, each
as one length byte and its bytes. Lane names hold no NUL, so lane prefixes are
prefix-free; length prefixes make the rest injective. A prefix of components
encodes to a byte prefix, so a tenant's or a workspace's keys are one range.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

MAX_COMPONENT_BYTES = 255


class TenantResourceLane(StrEnum):
    """Kinds of tenant resources, each a key range of its own."""

    SESSION_STATE = "session_state"
    SESSION_META = "session_meta"  # per session: when last written, or its erasure's tombstone
    SESSION_VERSION = "session_version"  # every applied write's record, numbered per session
    APPROVAL_PACKET = "approval_packet"
    APPROVAL_INDEX = "approval_index"  # approvals in force, by session and expiry
    TRACE_EVIDENCE = "trace_evidence"
    TRACE_INDEX = "trace_index"
    TRACE_META = "trace_meta"
    MERKLE_NODE = "merkle_node"  # per chain: its Merkle tree's complete-subtree hashes


@dataclass(frozen=True)
class LaneKey:
    """A key inside a lane. Empty scope components mean 'not scoped at that level'."""

    lane: TenantResourceLane
    tenant: str = ""
    workspace: str = ""
    session: str = ""
    name: bytes = b""

    def encode(self) -> bytes:
        tenant, workspace, session = (
            self.tenant.encode(),
            self.workspace.encode(),
            self.session.encode(),
        )
        name = self.name
        if max(len(tenant), len(workspace), len(session), len(name)) > MAX_COMPONENT_BYTES:
            raise ValueError("key component longer than 255 bytes")
        return b"".join(  # the hot path of every read and write: no loop, no bytearray
            (
                _LANE_PREFIXES[self.lane],
                _LENGTHS[len(tenant)],
                tenant,
                _LENGTHS[len(workspace)],
                workspace,
                _LENGTHS[len(session)],
                session,
                _LENGTHS[len(name)],
                name,
            )
        )

    def digest(self) -> str:
        """`sha256:` of the encoded key: names a key in reports without spelling it out."""
        return "sha256:" + hashlib.sha256(self.encode()).hexdigest()


def lane_prefix(lane: TenantResourceLane) -> bytes:
    return lane.value.encode("ascii") + b"\x00"


_LANE_PREFIXES = {lane: lane_prefix(lane) for lane in TenantResourceLane}
_LENGTHS = [bytes([size]) for size in range(MAX_COMPONENT_BYTES + 1)]


def scope_prefix(lane: TenantResourceLane, *scope: str) -> bytes:
    """The byte prefix of every key in lane under the given leading scope components."""
    return lane_prefix(lane) + _components(*(part.encode() for part in scope))


def successor(prefix: bytes) -> bytes | None:
    """The least byte string greater than every string that starts with prefix (None: none)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def key_range(
    prefix: bytes, start: LaneKey | None, stop: LaneKey | None
) -> tuple[bytes, bytes | None]:
    """The encoded keys a scan under prefix covers: from the greater of prefix and start,
    up to (not including) the lesser of prefix's end and stop (None: no end)."""
    low = prefix if start is None else max(prefix, start.encode())
    high = successor(prefix)
    if stop is not None:
        high = stop.encode() if high is None else min(high, stop.encode())
    return low, high


def decode_key(data: bytes) -> LaneKey:
    """The inverse of `LaneKey.encode`; raises ValueError on bytes it never produces."""
    lane_name, sep, rest = data.partition(b"\x00")
    if not sep:
        raise ValueError("key has no lane prefix")
    lane = TenantResourceLane(lane_name.decode("ascii"))
    parts: list[bytes] = []
    offset = 0
    for _ in range(4):
        if offset >= len(rest):
            raise ValueError("key is truncated")
        size = rest[offset]
        part = rest[offset + 1 : offset + 1 + size]
        if len(part) != size:
            raise ValueError("key is truncated")
        parts.append(part)
        offset += 1 + size
    if offset != len(rest):
        raise ValueError("key has trailing bytes")
    tenant, workspace, session, name = parts
    return LaneKey(lane, tenant.decode(), workspace.decode(), session.decode(), name)


def _components(*parts: bytes) -> bytes:
    out = bytearray()
    for part in parts:
        if len(part) > MAX_COMPONENT_BYTES:
            raise ValueError("key component longer than 255 bytes")
        out.append(len(part))
        out += part
    return bytes(out)
