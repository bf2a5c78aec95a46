"""`RecordWrites`: the session records a batch of the journal writes, each by its precondition.

A write's precondition is decided against the stored state as the batch leaves
it so far: two writes of one session in one batch see each other, the second
against the record the first wrote. What the store held when the batch first
read a session is what its commit expects, so a record another process wrote
meanwhile is never lost: the commit fails (`ExpectationFailed`), nothing is
written, and the journal decides the batch again.
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


@dataclass
class StateWrite:
    """A record to store if its precondition holds against the version it replaces."""

    record: SessionStateRecord
    precondition: Precondition


class RecordWrites:
    """The records one batch writes, with what its commit expects each replaced one to be."""

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes
        self._versions: dict[bytes, StoredVersion] = {}  # each session as the batch leaves it
        self._expected: dict[bytes, tuple[LaneKey, bytes | None]] = {}  # as first read
        self._puts: list[tuple[LaneKey, bytes]] = []
        self._written: list[tuple[SessionStateRecord, bytes]] = []

    def version(self, write: StateWrite) -> StoredVersion:
        """What the write's record replaces as the batch leaves it so far."""
        scope = write.record.scope
        key = state_key(scope)
        encoded = key.encode()
        if encoded not in self._versions:
            stored = self._lanes.get(key)
            self._expected[encoded] = (key, stored)
            self._versions[encoded] = (
                NOTHING_STORED if stored is None else stored_version(scope, key, stored)
            )
        return self._versions[encoded]

    def write(self, write: StateWrite) -> None:
        """Store the write's record: its precondition held against `version`."""
        key = state_key(write.record.scope)
        value = canonical_json(write.record.to_json())
        self._puts.append((key, value))
        self._written.append((write.record, value))
        self._versions[key.encode()] = StoredVersion(
            write.record.state_digest, write.record.summary
        )

    def add_to(self, batch: LaneBatch) -> None:
        for key, stored in self._expected.values():
            batch.expect(key, stored)
        for key, value in self._puts:
            batch.put(key, value)

    def committed(self) -> None:
        """The batch committed: remember each record as written, for the next read of it."""
        for record, encoded in self._written:
            PARSED_RECORDS.remember(record, encoded)
