"""`SessionStateStore`: session records in the `session_state` lane.

Reads fail closed: bytes that do not parse, validate, digest-check and belong
to their key come back as a corrupt `SessionStateReadReport` with a label from
a fixed vocabulary and the digest of the bytes, never the bytes themselves.
Writes are compare-and-set on the current `state_digest`, synced to disk: the
record is decided on as read, and the batch that writes it expects the bytes
read, so a write by another thread or process in between is decided on again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from pydantic import ValidationError

from store.backends.contract import ExpectationFailed, Lanes, StoreOffline
from store.canonical import canonical_json, sha256_digest
from store.chain.head import format_timestamp
from store.key_codec import LaneKey, TenantResourceLane
from store.record.blockers import Blocker, CorruptionLabel
from store.record.reports import SessionStateReadReport
from store.record.state_record import (
    NO_COMPACTED_TURNS,
    CompactedTurns,
    Lineage,
    SessionStateRecord,
)
from store.record.validation import record_blockers
from store.scope import TenantScope
from store.session_data import Erasure, SessionMeta, read_meta
from store.session_order import page_in_id_order
from store.version_lane import (
    VERSIONS_KEPT_DEFAULT,
    VersionLine,
    VersionSummary,
    change,
    newest_number,
)

MAX_WRITE_ROUNDS = 64  # reads of a record that others keep changing before giving up


@dataclass(frozen=True)
class StoredVersion:
    """What is stored: its version (the state digest, a corrupt record's `error_digest`,
    None for nothing), its summary of compacted turns (empty for none, v1 or corrupt) and
    a forked session's lineage (None: never forked). A write builds on it, and a
    precondition is checked against it."""

    version: str | None
    compacted: CompactedTurns = NO_COMPACTED_TURNS
    lineage: Lineage | None = None


NOTHING_STORED = StoredVersion(None)


@dataclass(frozen=True)
class BuiltOn:
    """The stored version a record was built from: its state digest, or None if none was."""

    version: str | None


@dataclass(frozen=True)
class Precondition:
    """What the stored version must be for a write to go ahead (`If-Match`, `If-None-Match`).

    Beside the client's, the service's own conditions keep summaries exact (see
    `extending`): `built_on`, the one version a record's summary extends, and
    `replaces_no_summary`, for a record without one.
    """

    if_match: str | None = None
    if_none_match_any: bool = False
    built_on: BuiltOn | None = None
    replaces_no_summary: bool = False

    def holds(self, current: StoredVersion) -> bool:
        if self.built_on is not None and self.built_on.version != current.version:
            return False
        if self.replaces_no_summary and current.compacted.count > 0:
            return False
        if self.if_none_match_any and current.version is not None:
            return False
        return self.if_match is None or self.if_match == current.version

    def extending(self, record: SessionStateRecord, base: StoredVersion) -> Precondition:
        """This precondition, and the service's own for record, built on base.

        A record with a summary extends base's: it is written only while base is
        the stored version (so no turn is compacted twice, and none a concurrent
        writer compacted is lost); so is one that keeps base's lineage (so no
        session is given another's). A record without either may replace no summary.
        """
        if record.summary.count > 0 or record.lineage is not None:
            return replace(self, built_on=BuiltOn(base.version))
        return replace(self, replaces_no_summary=True)


@dataclass(frozen=True)
class ListedSession:
    """A session of a workspace's list: its record as read, and its meta key."""

    scope: TenantScope
    report: SessionStateReadReport
    meta: SessionMeta | None
    version: int  # the record's: its newest version's number (1: written before versions)


class PreconditionFailed(Exception):
    """The stored version is not the one the write was based on."""


@dataclass(frozen=True)
class StoredWrite:
    created: bool
    key_digest: str


class ParsedRecords:
    """The last good record of each recently used session, kept with its exact stored bytes.

    One exchange reads the same bytes several times (a load, a replay preview,
    the base of the write, the journal's precondition check), and parsing and
    checking a full window of turns is the dearest part of each. Parsing depends
    on the scope and the bytes alone, so a record is reused only for the very
    bytes it came from; anything else is parsed and checked afresh.
    """

    def __init__(self, sessions: int = 64) -> None:
        self._sessions = sessions
        self._records: OrderedDict[TenantScope, tuple[bytes, SessionStateRecord]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, scope: TenantScope, stored: bytes) -> SessionStateRecord | None:
        with self._lock:
            found = self._records.get(scope)
            if found is None or found[0] != stored:
                return None
            self._records.move_to_end(scope)
            return found[1]

    def forget(self, scope: TenantScope) -> None:
        """Keep nothing of scope's record (it was erased)."""
        with self._lock:
            self._records.pop(scope, None)

    def remember(self, record: SessionStateRecord, stored: bytes) -> None:
        """Keep record as what `stored` parses to; only for bytes written or read good."""
        with self._lock:
            self._records[record.scope] = (stored, record)
            self._records.move_to_end(record.scope)
            while len(self._records) > self._sessions:
                self._records.popitem(last=False)


PARSED_RECORDS = ParsedRecords()


def state_key(scope: TenantScope) -> LaneKey:
    return LaneKey(
        TenantResourceLane.SESSION_STATE, scope.tenant_id, scope.workspace_id, scope.session_id
    )


class SessionStateStore:
    """Session records over a lane store, one key per tenant/workspace/session."""

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes
        # Writers of this process take turns; the batch's expectation covers other processes.
        self._write_lock = threading.Lock()

    def read(self, scope: TenantScope) -> SessionStateReadReport | None:
        """The stored record as a read report; None when nothing is stored."""
        key = state_key(scope)
        stored = self._lanes.get(key)
        if stored is None:
            return None
        return read_report(scope, key.digest(), stored)

    def erasure(self, scope: TenantScope) -> Erasure | None:
        """The session's tombstone, when it was erased and nothing was written since."""
        meta = read_meta(self._lanes, scope)
        return None if meta is None else meta.erasure

    def listed(
        self, tenant: str, workspace: str, after: str | None, limit: int
    ) -> tuple[list[ListedSession], bool]:
        """Up to `limit` of the workspace's stored sessions after session `after`, in
        session-id order, and whether more follow. A seek per session-id length in the
        workspace's range, and per session listed its meta key and its newest version
        (one seek in the session's own range): its cost follows the page, not the store."""
        page, more = page_in_id_order(
            self._lanes, TenantResourceLane.SESSION_STATE, tenant, workspace, after, limit
        )
        listed = []
        for key, stored in page:
            scope = TenantScope(tenant_id=tenant, workspace_id=workspace, session_id=key.session)
            report = read_report(scope, key.digest(), stored)
            meta = read_meta(self._lanes, scope)
            listed.append(ListedSession(scope, report, meta, newest_number(self._lanes, scope)))
        return listed, more

    def base(self, scope: TenantScope) -> StoredVersion:
        """The stored version and its summary: what a write builds on."""
        key = state_key(scope)
        stored = self._lanes.get(key)
        return NOTHING_STORED if stored is None else stored_version(scope, key, stored)

    def write(
        self,
        record: SessionStateRecord,
        precondition: Precondition = Precondition(),
        also: Sequence[tuple[LaneKey, bytes]] = (),
        *,
        kept: int = VERSIONS_KEPT_DEFAULT,
    ) -> StoredWrite:
        """Store record if precondition holds on the stored version, with `also` in one batch,
        and keep it as the session's next version (at most `kept` of them)."""
        blockers = record_blockers(record)
        if blockers:
            raise ValueError("refusing to store a record with blockers: " + ", ".join(blockers))
        key = state_key(record.scope)
        with self._write_lock:
            for _ in range(MAX_WRITE_ROUNDS):
                stored = self._lanes.get(key)
                current = (
                    NOTHING_STORED if stored is None else stored_version(record.scope, key, stored)
                )
                if not precondition.holds(current):
                    raise PreconditionFailed
                encoded = canonical_json(record.to_json())
                replaced = None if stored is None else (stored, current.version or "")
                line = VersionLine.read(self._lanes, record.scope, replaced)
                summary = VersionSummary(
                    version=line.next_version,
                    state_digest=record.state_digest,
                    written_at=format_timestamp(datetime.now(UTC)),
                    decision_id=None,
                )
                try:
                    with self._lanes.batch(sync=True) as batch:
                        batch.expect(key, stored)
                        batch.expect(line.next_key, None)
                        batch.put(key, encoded)
                        for extra_key, value in also:
                            batch.put(extra_key, value)
                        for version, kept_value in line.changes(
                            self._lanes, summary, encoded, kept=kept
                        ):
                            change(batch, version, kept_value)
                except ExpectationFailed:
                    continue  # written meanwhile by another process: decide again on that
                PARSED_RECORDS.remember(record, encoded)
                return StoredWrite(created=stored is None, key_digest=key.digest())
        raise StoreOffline("the record kept changing under the write; nothing was written")


def read_report(scope: TenantScope, key_digest: str, stored: bytes) -> SessionStateReadReport:
    """Parse stored bytes for scope, failing closed to a redacted corrupt report."""
    record, label = _parse(scope, stored)
    if label is not None:
        return corrupt_report(key_digest, stored, label)
    return SessionStateReadReport(key_digest=key_digest, record=record, corrupt=False)


def corrupt_report(
    key_digest: str, stored: bytes, label: CorruptionLabel
) -> SessionStateReadReport:
    """Stored bytes that are no good record: a label and their digest, never the bytes."""
    return SessionStateReadReport(
        key_digest=key_digest,
        record=None,
        corrupt=True,
        redacted_error=label,
        error_digest=sha256_digest(stored),
    )


def stored_version(scope: TenantScope, key: LaneKey, stored: bytes) -> StoredVersion:
    """What preconditions compare against: a corrupt record's version is its `error_digest`."""
    report = read_report(scope, key.digest(), stored)
    if report.record is not None:
        record = report.record
        return StoredVersion(record.state_digest, record.summary, record.lineage)
    return StoredVersion(sha256_digest(stored))


def _parse(
    scope: TenantScope, stored: bytes
) -> tuple[SessionStateRecord | None, CorruptionLabel | None]:
    known = PARSED_RECORDS.get(scope, stored)
    if known is not None:
        return known, None
    record, label = _parse_afresh(scope, stored)
    if record is not None:
        PARSED_RECORDS.remember(record, stored)
    return record, label


def _parse_afresh(
    scope: TenantScope, stored: bytes
) -> tuple[SessionStateRecord | None, CorruptionLabel | None]:
    try:
        text = stored.decode("utf-8")
    except UnicodeDecodeError:
        return None, CorruptionLabel.MALFORMED
    try:
        record = SessionStateRecord.model_validate_json(text, strict=True)
    except ValidationError as error:  # never re-raised: its text may quote the stored bytes
        if any(detail["type"] == "json_invalid" for detail in error.errors(include_input=False)):
            return None, CorruptionLabel.MALFORMED
        return None, CorruptionLabel.SCHEMA_MISMATCH
    except Exception:  # e.g. recursion limits on absurd nesting: still just corrupt
        return None, CorruptionLabel.MALFORMED
    if canonical_json(record.to_json()) != stored:
        # Only the canonical encoding is ever written; anything else was changed on disk.
        return None, _label_of(record_blockers(record)) or CorruptionLabel.MALFORMED
    label = _label_of(record_blockers(record))
    if label is not None:
        return None, label
    if record.scope != scope:
        return None, CorruptionLabel.SCOPE_MISMATCH
    return record, None


def _label_of(blockers: Sequence[Blocker]) -> CorruptionLabel | None:
    if not blockers:
        return None
    if Blocker.SCHEMA_MISMATCH in blockers:
        return CorruptionLabel.SCHEMA_MISMATCH
    if Blocker.DIGEST_MISMATCH in blockers:
        return CorruptionLabel.DIGEST_MISMATCH
    return CorruptionLabel.VALIDATION_FAILED
