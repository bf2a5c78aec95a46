"""`RecordWrites`: the session records a batch of the journal writes, each by its precondition.

A write's precondition is decided against the stored state as the batch leaves
it so far: two writes of one session in one batch see each other, the second
against the record the first wrote. What the store held when the batch first
read a session is what its commit expects, so a record another process wrote
meanwhile is never lost: the commit fails (`ExpectationFailed`), nothing is
written, and the journal decides the batch again.

Each record written is kept as its session's next version too (`store.version_lane`),
named by the decision that allowed it and the batch's time, and the versions beyond the
newest the write keeps are dropped, in the same batch; the commit expects the next
version's number, as first read, to be free.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.backends.contract import LaneBatch, Lanes
from store.canonical import canonical_json
from store.key_codec import LaneKey
from store.record.state_record import SessionStateRecord
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


class RecordWrites:
    """The records one batch writes, with what its commit expects each replaced one to be."""

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes
        self._versions: dict[bytes, StoredVersion] = {}  # each session as the batch leaves it
        self._expected: dict[bytes, tuple[LaneKey, bytes | None]] = {}  # as first read
        self._lines: dict[bytes, VersionLine] = {}  # each session's versions as left so far
        self._puts: list[tuple[LaneKey, bytes | None]] = []  # None: delete
        self._written: list[tuple[SessionStateRecord, bytes]] = []

    def version(self, write: StateWrite) -> StoredVersion:
        """What the write's record replaces as the batch leaves it so far."""
        scope = write.record.scope
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

    def write(self, write: StateWrite, *, decision_id: str, written_at: str) -> int:
        """Store the write's record (its precondition held against `version`) as its
        session's next version, allowed by `decision_id` at `written_at`; that number."""
        key = state_key(write.record.scope)
        value = canonical_json(write.record.to_json())
        line = self._lines[key.encode()]
        summary = VersionSummary(
            version=line.next_version,
            state_digest=write.record.state_digest,
            written_at=written_at,
            decision_id=decision_id,
        )
        self._puts.append((key, value))
        self._puts += line.changes(self._lanes, summary, value, kept=write.kept)
        self._written.append((write.record, value))
        self._versions[key.encode()] = StoredVersion(
            write.record.state_digest, write.record.summary
        )
        return summary.version

    def add_to(self, batch: LaneBatch) -> None:
        for key, stored in self._expected.values():
            batch.expect(key, stored)
        for key, value in self._puts:
            change(batch, key, value)

    def committed(self) -> None:
        """The batch committed: remember each record as written, for the next read of it."""
        for record, encoded in self._written:
            PARSED_RECORDS.remember(record, encoded)
