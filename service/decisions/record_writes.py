"""`RecordWrites`: the session records a batch of the journal writes or erases, each by its
precondition.

A write's or erasure's precondition is decided against the stored state as the
batch leaves it so far: two changes of one session in one batch see each other,
the second against what the first left. What the store held when the batch
first read a session is what its commit expects, so a record another process
wrote meanwhile is never lost: the commit fails (`ExpectationFailed`), nothing
is written, and the journal decides the batch again.

A write stores the record and the session's meta key (`updated_at`, the batch's
time; it replaces a tombstone), and keeps the record as its session's next
version (`store.version_lane`), named by the decision that allowed it and the
batch's time; the versions beyond the newest the write keeps are dropped, in the
same batch, and the commit expects the next version's number, as first read, to
be free. An erasure deletes every key of the session in
`store.session_data.SESSION_DATA_LANES` (its record and its versions, those
stored and those this batch put) and leaves the tombstone in the meta key: the
session's next write is version 1 again.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.backends.contract import LaneBatch, Lanes
from store.canonical import canonical_json
from store.key_codec import LaneKey, scope_prefix
from store.record.state_record import SessionStateRecord
from store.scope import TenantScope
from store.session_data import (
    SESSION_DATA_LANES,
    Erasure,
    ErasureReason,
    erased_meta,
    meta_key,
    session_data_keys,
    written_meta,
)
from store.session_state import (
    NOTHING_STORED,
    PARSED_RECORDS,
    Precondition,
    StoredVersion,
    state_key,
    stored_version,
)
from store.version_lane import VERSIONS_KEPT_DEFAULT, VersionLine, VersionSummary, change


@dataclass
class StateWrite:
    """A record to store if its precondition holds against the version it replaces."""

    record: SessionStateRecord
    precondition: Precondition
    kept: int = VERSIONS_KEPT_DEFAULT  # the session's versions kept, this one among them

    @property
    def scope(self) -> TenantScope:
        return self.record.scope


@dataclass
class StateErase:
    """A session to erase if its precondition holds against the version stored."""

    scope: TenantScope
    precondition: Precondition
    reason: ErasureReason = "requested"
    # An expiry's: the newest version number its decision saw. The erasure holds only while
    # that is still the newest: any write since, even of the same content, took the next.
    newest: int | None = None


class RecordWrites:
    """The records one batch writes or erases, with what its commit expects each to be."""

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes
        self._versions: dict[bytes, StoredVersion] = {}  # each session as the batch leaves it
        self._expected: dict[bytes, tuple[LaneKey, bytes | None]] = {}  # as first read
        self._lines: dict[bytes, VersionLine] = {}  # each session's versions as left so far
        self._changes: list[tuple[LaneKey, bytes | None]] = []  # in order; None deletes
        self._written: list[tuple[SessionStateRecord, bytes]] = []
        self._erased: list[TenantScope] = []

    def version(self, scope: TenantScope) -> StoredVersion:
        """What the session holds as the batch leaves it so far."""
        key = state_key(scope)
        encoded = key.encode()
        if encoded not in self._versions:
            stored = self._lanes.get(key)
            self._expected[encoded] = (key, stored)
            version = NOTHING_STORED if stored is None else stored_version(scope, key, stored)
            self._versions[encoded] = version
            replaced = None if stored is None else (stored, version.version or "")
            line = VersionLine.read(self._lanes, scope, replaced)
            self._lines[encoded] = line
            self._expected[line.next_key.encode()] = (line.next_key, None)
        return self._versions[encoded]

    def newest(self, scope: TenantScope) -> int:
        """The session's newest version number as the batch leaves it so far (0: none);
        `version(scope)` read it first."""
        return self._lines[state_key(scope).encode()].next_version - 1

    def write(self, write: StateWrite, *, decision_id: str, written_at: str) -> int:
        """Store the write's record (its precondition held against `version`) as its
        session's next version, allowed by `decision_id` at `written_at`; that number."""
        key = state_key(write.scope)
        value = canonical_json(write.record.to_json())
        line = self._lines[key.encode()]
        summary = VersionSummary(
            version=line.next_version,
            state_digest=write.record.state_digest,
            written_at=written_at,
            decision_id=decision_id,
        )
        self._changes += [(key, value), (meta_key(write.scope), written_meta(written_at))]
        self._changes += line.changes(self._lanes, summary, value, kept=write.kept)
        self._written.append((write.record, value))
        record = write.record
        self._versions[key.encode()] = StoredVersion(
            record.state_digest, record.summary, record.lineage
        )
        return summary.version

    def erase(self, scope: TenantScope, erasure: Erasure) -> None:
        """Delete the session's data and leave its tombstone: its precondition held."""
        deleted = {key.encode(): key for key in session_data_keys(self._lanes, scope)}
        prefixes = tuple(
            scope_prefix(lane, scope.tenant_id, scope.workspace_id, scope.session_id)
            for lane in SESSION_DATA_LANES
        )
        for key, _ in self._changes:  # what this batch put there so far goes too
            if key.encode().startswith(prefixes):
                deleted[key.encode()] = key
        self._changes += [(key, None) for key in deleted.values()]
        self._changes.append((meta_key(scope), erased_meta(erasure)))
        encoded = state_key(scope).encode()
        self._versions[encoded] = NOTHING_STORED
        self._lines[encoded] = VersionLine(scope, 0)  # no version left: the next is 1
        self._written = [
            (record, value) for record, value in self._written if record.scope != scope
        ]
        self._erased.append(scope)

    def add_to(self, batch: LaneBatch) -> None:
        for key, stored in self._expected.values():
            batch.expect(key, stored)
        for key, value in self._changes:
            change(batch, key, value)

    def committed(self) -> None:
        """The batch committed: remember each record as written, for the next read of it,
        and forget each erased one."""
        for scope in self._erased:
            PARSED_RECORDS.forget(scope)
        for record, encoded in self._written:
            PARSED_RECORDS.remember(record, encoded)
