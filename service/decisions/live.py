"""Which policy revision was live when, on this deployment: its live intervals.

A revision is live on a service instance from the moment the instance knows OPA decides
with it (its start, a reload that loaded, the first decision seen with it) until it is
replaced, the instance stops, or (after a crash) the instance starts again. The intervals
are kept in the store, one key per revision in the `trace_meta` lane (outside every
tenant's chain): the revision's intervals, appended, each naming the instance it was live
on. Every instance that shares the store (replicas on PostgreSQL) appends to the same keys,
so a revision's intervals are those of the whole deployment; two replicas that serve it
give it two intervals that overlap.

An instance is a data dir: its id (`instance.id`, random, made once) is the same for the
service and its workers (`serve --workers N`) and across restarts. The process that owns
the instance (the service, or the parent of the workers) opens an interval at start and
closes it at a clean stop (`stopped`); an interval it left open (a crash) is closed by its
next start, at that start's time (`restarted`: the revision was live at most until then).
Where the service runs no local sidecar (`SESSIONSTATE_OPA_URL`), it learns the live
revision from OPA's answers: an interval starts at the first decision made with it.

A decision OPA did not make (it did not answer, or refused the service) is counted by the
revision summaries under the revision live on the instance when it failed (`current`).
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from service.policy.client import UNKNOWN
from service.policy.trace import DecisionTrace
from store.backends.contract import ExpectationFailed, Lanes
from store.canonical import canonical_json
from store.chain.head import format_timestamp
from store.chain.keys import LEGACY_CHAIN
from store.key_codec import LaneKey, TenantResourceLane
from store.secrets import local_key_file

log = logging.getLogger("sessionstate.policy")
_PREFIX = b"live:"
INSTANCE_FILE = "instance.id"
UPDATE_ATTEMPTS = 16
Ended = Literal["replaced", "stopped", "restarted"]


class LiveInterval(BaseModel):
    """One stretch of time a revision was live on one service instance."""

    model_config = ConfigDict(
        extra="forbid", serialize_by_alias=True, validate_by_name=True, validate_by_alias=True
    )

    from_: str = Field(alias="from", description="RFC 3339: when it became live")
    to: str | None = Field(description="RFC 3339: when it stopped being live; null: live now")
    instance: str = Field(description="the service instance (data dir) it was live on")
    ended: Ended | None = Field(
        description="`replaced` by another revision, `stopped` with the service, `restarted`: "
        "the service did not stop cleanly and `to` is its next start; null while live"
    )

    def covers(self, at: datetime) -> bool:
        start = datetime.fromisoformat(self.from_)
        return start <= at and (self.to is None or at <= datetime.fromisoformat(self.to))


_INTERVALS = TypeAdapter(list[LiveInterval])


def live_key(revision: str) -> LaneKey:
    return LaneKey(TenantResourceLane.TRACE_META, LEGACY_CHAIN, name=_PREFIX + revision.encode())


def fits(revision: str) -> bool:
    """Whether a revision can be a key's name (a key name holds at most 255 bytes)."""
    return bool(revision) and len(_PREFIX) + len(revision.encode()) <= 255


def instance_id(data_dir: Path) -> str:
    """The data dir's instance id (`instance.id`, not a secret: beside the secrets folder),
    made on first use; the same for all its processes."""
    made = local_key_file(data_dir, INSTANCE_FILE, lambda: secrets.token_hex(8).encode() + b"\n")
    return made.decode("ascii").strip()


def _parsed(value: bytes) -> list[LiveInterval]:
    try:
        return _INTERVALS.validate_json(value)
    except ValidationError:
        return []  # a damaged record is replaced by what follows


def stored(lanes: Lanes) -> dict[str, list[LiveInterval]]:
    """Every revision's live intervals, as stored (each list oldest first)."""
    return {
        key.name[len(_PREFIX) :].decode(): _parsed(value)
        for key, value in lanes.scan(TenantResourceLane.TRACE_META, LEGACY_CHAIN)
        if key.name.startswith(_PREFIX)
    }


def live_at(records: dict[str, list[LiveInterval]], at: str) -> str | None:
    """The revision live at `at` (the one that became live last, if several were)."""
    moment = datetime.fromisoformat(at)
    covering = [
        (datetime.fromisoformat(interval.from_), revision)
        for revision, intervals in records.items()
        for interval in intervals
        if interval.covers(moment)
    ]
    return max(covering)[1] if covering else None


def _open_on(records: dict[str, list[LiveInterval]], instance: str) -> str | None:
    for revision, intervals in records.items():
        if any(i.instance == instance and i.to is None for i in intervals):
            return revision
    return None


def _closed(
    intervals: Iterable[LiveInterval], instance: str, at: str, ended: Ended
) -> list[LiveInterval]:
    return [
        i.model_copy(update={"to": at, "ended": ended})
        if i.instance == instance and i.to is None
        else i
        for i in intervals
    ]


def _update(lanes: Lanes, change: Callable[[dict[str, list[LiveInterval]]], set[str]]) -> None:
    """Apply `change` (which edits the records in place and names the revisions it changed)
    to the records as stored, in one batch that expects each changed key as read."""
    for _ in range(UPDATE_ATTEMPTS):
        raw = {
            key.name[len(_PREFIX) :].decode(): value
            for key, value in lanes.scan(TenantResourceLane.TRACE_META, LEGACY_CHAIN)
            if key.name.startswith(_PREFIX)
        }
        records = {revision: _parsed(value) for revision, value in raw.items()}
        changed = change(records)
        if not changed:
            return
        try:
            with lanes.batch(sync=True) as batch:
                for revision in changed:
                    batch.expect(live_key(revision), raw.get(revision))
                    dumped = [i.model_dump(mode="json") for i in records[revision]]
                    batch.put(live_key(revision), canonical_json(dumped))
        except ExpectationFailed:  # another instance changed them: read again
            continue
        return
    raise RuntimeError("other instances kept changing the live revisions")


class LiveRevisions:
    """This instance's live revision, in memory and in the store."""

    def __init__(
        self, lanes: Lanes, instance: str, clock: Callable[[], datetime], *, owns: bool
    ) -> None:
        self._lanes = lanes
        self.instance = instance
        self._clock = clock
        self._owns = owns  # opens at start, closes at stop; else another process does
        self._current: str | None = None
        self._since = ""
        self._lock = threading.Lock()

    def started(self, revision: str | None) -> None:
        """At start: close what a crash left open on this instance, then open `revision`."""
        at = format_timestamp(self._clock())

        def change(records: dict[str, list[LiveInterval]]) -> set[str]:
            changed = self._close_all(records, at, "restarted")
            if revision is not None and fits(revision):
                changed |= self._open(records, revision, at)
            return changed

        with self._lock:
            self._safely(change)
            self._current, self._since = revision, at

    def activate(self, revision: str, at: str | None = None) -> None:
        """`revision` is live on this instance from `at` (now by default)."""
        when = at or format_timestamp(self._clock())
        if revision == UNKNOWN or not fits(revision):
            return

        def change(records: dict[str, list[LiveInterval]]) -> set[str]:
            if _open_on(records, self.instance) == revision:
                return set()
            return self._close_all(records, when, "replaced") | self._open(records, revision, when)

        with self._lock:
            if self._safely(change):
                self._current, self._since = revision, when

    def observe(self, trace: DecisionTrace) -> None:
        """A decision OPA made: its revision is live (no local sidecar tells of reloads)."""
        revision = trace.policy_revision
        if trace.engine_unavailable or revision == self._current or revision == UNKNOWN:
            return
        since = self._since
        if since and datetime.fromisoformat(trace.evaluated_at) < datetime.fromisoformat(since):
            return  # asked before the revision that is current now was seen: not newer
        self.activate(revision, trace.evaluated_at)

    def current(self) -> str | None:
        """The revision live on this instance now: as this process knows it if it owns the
        instance or learns from OPA's answers, else as the owner recorded it."""
        if self._owns:
            return self._current
        try:
            return _open_on(stored(self._lanes), self.instance) or self._current
        except Exception:  # the store is not readable: what this process saw last
            return self._current

    def stopped(self) -> None:
        """A clean stop: this instance's open interval ends now."""
        if not self._owns:
            return
        at = format_timestamp(self._clock())
        with self._lock:
            self._safely(lambda records: self._close_all(records, at, "stopped"))
            self._current = None

    def _close_all(self, records: dict[str, list[LiveInterval]], at: str, ended: Ended) -> set[str]:
        changed = set()
        for revision, intervals in records.items():
            if any(i.instance == self.instance and i.to is None for i in intervals):
                records[revision] = _closed(intervals, self.instance, at, ended)
                changed.add(revision)
        return changed

    def _open(self, records: dict[str, list[LiveInterval]], revision: str, at: str) -> set[str]:
        opened = LiveInterval(from_=at, to=None, instance=self.instance, ended=None)
        records[revision] = [*records.get(revision, []), opened]
        return {revision}

    def _safely(self, change: Callable[[dict[str, list[LiveInterval]]], set[str]]) -> bool:
        """Record a change; a store that cannot take it is logged, never fails a request."""
        try:
            _update(self._lanes, change)
        except Exception as error:
            log.error("live_revision_not_recorded", extra={"error_type": type(error).__name__})
            return False
        return True
