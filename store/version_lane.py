"""The `session_version` lane: every applied write's record, numbered 1, 2, 3 … per session.

Versions live in the `session_version` lane, one key per version under the
session's tenant, workspace and session (the number, 8 bytes big-endian, as its
name), so a session's versions are one key range and its newest is the first
of a reverse scan. A version's value is its summary (`VersionSummary`, canonical
JSON, one line) and then, after a newline, the record's bytes exactly as the
`session_state` lane held them, so a version reads back as the record did and
fails closed alike.

The newest version is the current record: each write puts its record as the
next version in the same batch as the record (`VersionLine.changes`), drops
the versions beyond the newest `kept`, and expects the next version's key to
be absent, so two writers never both take one number. A record written before
versions were kept is version 1 (`LEGACY_VERSION`): reads say so, and the
first write over it keeps it as version 1 before its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from store.backends.contract import LaneBatch, LaneView, StoreOffline
from store.canonical import canonical_json, sha256_digest
from store.key_codec import LaneKey, TenantResourceLane
from store.scope import TenantScope

LANE = TenantResourceLane.SESSION_VERSION
LEGACY_VERSION = 1  # what a record written before versions were kept is
VERSIONS_KEPT_DEFAULT = 20  # bounds of SESSIONSTATE_STATE_VERSIONS_KEPT
VERSIONS_KEPT_MAX = 1000
MAX_VERSION = 2**53 - 1
MAX_READ_ROUNDS = 16  # reads of a record that writers keep changing before giving up
_NUMBER_BYTES = 8


class VersionSummary(BaseModel):
    """One version of a session's record, without its content."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1, le=MAX_VERSION, description="1 for the session's first record")
    state_digest: str = Field(
        max_length=160,
        description="the record's state digest (a corrupt record's: sha256 of its bytes)",
    )
    written_at: str | None = Field(
        description="RFC 3339, when the write that made it committed; null for a record "
        "written before versions were kept"
    )
    decision_id: str | None = Field(
        description="the decision that allowed the write; null for a record written before "
        "versions were kept"
    )


@dataclass(frozen=True)
class StoredRecordVersion:
    """A version as stored: its summary and the record's bytes."""

    summary: VersionSummary
    record: bytes


def version_key(scope: TenantScope, version: int) -> LaneKey:
    return LaneKey(
        LANE,
        scope.tenant_id,
        scope.workspace_id,
        scope.session_id,
        version.to_bytes(_NUMBER_BYTES, "big"),
    )


def encode_version(summary: VersionSummary, record: bytes) -> bytes:
    """A version's stored value: its summary (canonical JSON holds no raw newline), a
    newline, and the record's bytes."""
    return canonical_json(summary.model_dump(mode="json")) + b"\n" + record


def decode_version(key: LaneKey, stored: bytes) -> StoredRecordVersion | None:
    """The version stored under key; None when its summary does not read as this key's."""
    head, sep, record = stored.partition(b"\n")
    if not sep or len(key.name) != _NUMBER_BYTES:
        return None
    try:
        summary = VersionSummary.model_validate_json(head, strict=True)
    except (ValidationError, ValueError):  # never re-raised: its text may quote the bytes
        return None
    if summary.version != int.from_bytes(key.name, "big"):
        return None
    return StoredRecordVersion(summary, record)


def summary_of(key: LaneKey, stored: bytes) -> VersionSummary:
    """What a listing shows of a stored version; one that does not read is named by its key's
    number and the digest of its bytes, and read (`read_version`) as corrupt."""
    decoded = decode_version(key, stored)
    if decoded is not None:
        return decoded.summary
    version = min(max(int.from_bytes(key.name, "big"), 1), MAX_VERSION)
    return VersionSummary(
        version=version, state_digest=sha256_digest(stored), written_at=None, decision_id=None
    )


def stored_versions(
    lanes: LaneView, scope: TenantScope, *, below: int | None = None
) -> Iterator[tuple[LaneKey, bytes]]:
    """The session's stored versions, newest first (below `below` only, when given).

    A session's versions are one run of numbers, at most `VERSIONS_KEPT_MAX` below its
    newest: every write drops those beyond what it keeps. The scan stops there, so it
    never walks the deletions older versions left (LevelDB keeps them until a
    compaction, and a scan steps over every one)."""
    newest = newest_stored(lanes, scope)
    if newest is None:
        return
    floor = version_key(scope, max(LEGACY_VERSION, number_of(newest[0]) - VERSIONS_KEPT_MAX + 1))
    stop = None if below is None else version_key(scope, below)
    yield from lanes.scan(
        LANE,
        scope.tenant_id,
        scope.workspace_id,
        scope.session_id,
        reverse=True,
        start=floor,
        stop=stop,
    )


def newest_stored(lanes: LaneView, scope: TenantScope) -> tuple[LaneKey, bytes] | None:
    """The newest stored version: one seek from the top of the session's range."""
    scan = lanes.scan(LANE, scope.tenant_id, scope.workspace_id, scope.session_id, reverse=True)
    return next(iter(scan), None)


def number_of(key: LaneKey) -> int:
    return int.from_bytes(key.name, "big")


def current_bytes(lanes: LaneView, scope: TenantScope, state: LaneKey) -> tuple[bytes, int] | None:
    """The stored record's bytes and its version; None when no record is stored.

    The record and its newest version are read one after the other, and a write may land
    between: they are read again until the newest version holds the record's very bytes,
    or until two reads find the same record and newest version that still differ (damage,
    not a write: the record's bytes are answered). A record with no version at all was
    written before versions were kept: version 1.
    """
    previous: tuple[bytes, LaneKey] | None = None
    for _ in range(MAX_READ_ROUNDS):
        stored = lanes.get(state)
        if stored is None:
            return None
        newest = newest_stored(lanes, scope)
        if newest is None:
            return stored, LEGACY_VERSION
        decoded = decode_version(*newest)
        if decoded is not None and decoded.record == stored:
            return stored, decoded.summary.version
        if previous == (stored, newest[0]):
            # Read alike twice: no write landed between, the record or its version is
            # damaged. The record's bytes go on to be read, and fail closed as corrupt.
            return stored, number_of(newest[0])
        previous = stored, newest[0]
    raise StoreOffline("the record and its versions kept changing under the read")


def newest_number(lanes: LaneView, scope: TenantScope) -> int:
    """The number of the session's newest version (one seek in the session's range); 1 for
    a record written before versions were kept. Read beside the record, not with it: a
    write between the two reads shows the newer number."""
    newest = newest_stored(lanes, scope)
    return LEGACY_VERSION if newest is None else number_of(newest[0])


def versions_count(lanes: LaneView, scope: TenantScope, *, record_stored: bool) -> int:
    """How many versions the session has: its stored versions, or 1 for a record written
    before versions were kept (it is version 1, alone); 0 when nothing is stored."""
    stored = sum(1 for _ in stored_versions(lanes, scope))
    return stored if stored or not record_stored else 1


@dataclass
class VersionLine:
    """A session's versions as a batch leaves them: the newest number stored or put so far
    (0: none), the record stored before versions were kept with its state digest (None:
    none, or kept already), and the numbers this batch put, which a later write of the
    batch may drop."""

    scope: TenantScope
    newest: int
    legacy: tuple[bytes, str] | None = None
    put: list[int] = field(default_factory=list)
    floor: int = LEGACY_VERSION  # every number below it is dropped already, in store or batch

    @classmethod
    def read(
        cls, lanes: LaneView, scope: TenantScope, stored: tuple[bytes, str] | None
    ) -> VersionLine:
        """The line of the session whose record is `stored` (its bytes and state digest;
        None: no record)."""
        newest = newest_stored(lanes, scope)
        if newest is None:
            return cls(scope, 0, legacy=stored)
        return cls(scope, number_of(newest[0]))

    @property
    def next_version(self) -> int:
        """The number the next write of the line takes."""
        return (LEGACY_VERSION if self.legacy is not None else self.newest) + 1

    @property
    def next_key(self) -> LaneKey:
        """The next version's key, absent until a write takes its number: a batch that
        expects it absent as first read loses a race to any other write of the session."""
        return version_key(self.scope, self.next_version)

    def changes(
        self, lanes: LaneView, summary: VersionSummary, record: bytes, *, kept: int
    ) -> list[tuple[LaneKey, bytes | None]]:
        """Put `record` as the next version (`summary` names it), after the record from
        before versions were kept as version 1, and drop the versions beyond the newest
        `kept` (a value None deletes its key). The line moves on to the new version."""
        out: list[tuple[LaneKey, bytes | None]] = []
        if self.legacy is not None:
            legacy, digest = self.legacy
            first = VersionSummary(
                version=LEGACY_VERSION, state_digest=digest, written_at=None, decision_id=None
            )
            out.append((version_key(self.scope, LEGACY_VERSION), encode_version(first, legacy)))
            self.put.append(LEGACY_VERSION)
            self.newest, self.legacy = LEGACY_VERSION, None
        if summary.version != self.next_version:
            raise ValueError("a version's number is the next of its session")
        self.newest = summary.version
        out.append((version_key(self.scope, self.newest), encode_version(summary, record)))
        self.put.append(self.newest)
        oldest_kept = self.newest - kept + 1
        dropped = {number for number in self.put if number < oldest_kept}
        dropped |= self._stored_below(lanes, oldest_kept)
        out += [(version_key(self.scope, number), None) for number in sorted(dropped)]
        self.put = [number for number in self.put if number >= oldest_kept]
        self.floor = max(self.floor, oldest_kept)
        return out

    def _stored_below(self, lanes: LaneView, oldest_kept: int) -> set[int]:
        """The stored versions below `oldest_kept`, found by one read each going down from
        it (and one more that finds none), not by a scan: the versions are one run of
        numbers, and a scan below them would step over every deletion older writes left.
        Numbers this batch put are not stored yet; those below `floor` are dropped already."""
        found: set[int] = set()
        number = oldest_kept - 1
        while number >= self.floor:
            if number not in self.put:
                if lanes.get(version_key(self.scope, number)) is None:
                    break
                found.add(number)
            number -= 1
        return found


def change(batch: LaneBatch, key: LaneKey, value: bytes | None) -> None:
    """Put value under key in batch; None deletes the key."""
    if value is None:
        batch.delete(key)
    else:
        batch.put(key, value)
