"""`SessionVersions`: a session's versions read back, each as the record was read.

What the `session_version` lane holds and how a write adds to it is
`store.version_lane`. Reads fail closed as the record's do: a version whose
bytes are no good record is a corrupt read report, and one whose summary does
not read is listed by its number and the digest of its bytes, and read as
corrupt. A record written before versions were kept is version 1, alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from store.backends.contract import LaneView
from store.record.blockers import CorruptionLabel
from store.record.reports import SessionStateReadReport
from store.scope import TenantScope
from store.session_state import corrupt_report, read_report, state_key
from store.version_lane import (
    LEGACY_VERSION,
    VersionSummary,
    current_bytes,
    decode_version,
    newest_stored,
    stored_versions,
    summary_of,
    version_key,
)

T = TypeVar("T")


class SessionVersions:
    """The versions of each session over a lane store."""

    def __init__(self, lanes: LaneView) -> None:
        self._lanes = lanes

    def current(self, scope: TenantScope) -> tuple[SessionStateReadReport, int] | None:
        """The stored record as a read report, and its version; None when nothing is stored."""
        key = state_key(scope)
        found = current_bytes(self._lanes, scope, key)
        return None if found is None else (read_report(scope, key.digest(), found[0]), found[1])

    def read(self, scope: TenantScope, version: int) -> SessionStateReadReport | None:
        """Version `version` of the session's record as a read report; None when it is not
        kept. Version 1 of a record written before versions were kept is the record."""
        key = version_key(scope, version)
        stored = self._lanes.get(key)
        if stored is None:
            return self._legacy(scope) if version == LEGACY_VERSION else None
        decoded = decode_version(key, stored)
        if decoded is None:  # its summary does not read: corrupt, named by its bytes
            return corrupt_report(key.digest(), stored, CorruptionLabel.MALFORMED)
        return read_report(scope, key.digest(), decoded.record)

    def page(
        self, scope: TenantScope, *, limit: int, below: int | None = None
    ) -> list[VersionSummary]:
        """Up to `limit` of the session's versions, newest first, below `below` if given."""
        stored = stored_versions(self._lanes, scope, below=below)
        listed = [summary_of(key, value) for key, value in _first(stored, limit)]
        if listed or (below is not None and below <= LEGACY_VERSION):
            return listed
        legacy = self._legacy(scope)
        if legacy is None:
            return []
        summary = VersionSummary(
            version=LEGACY_VERSION,
            state_digest=version_digest(legacy),
            written_at=None,
            decision_id=None,
        )
        return [summary]

    def _legacy(self, scope: TenantScope) -> SessionStateReadReport | None:
        """The record, when it was written before versions were kept (it has none)."""
        if newest_stored(self._lanes, scope) is not None:
            return None
        found = self.current(scope)
        return None if found is None else found[0]


def version_digest(report: SessionStateReadReport) -> str:
    """What names a stored version: its record's state digest, a corrupt one's error digest."""
    if report.record is not None:
        return report.record.state_digest
    assert report.error_digest is not None
    return report.error_digest


def _first(items: Iterator[T], limit: int) -> list[T]:
    return [item for _, item in zip(range(limit), items, strict=False)]
