"""The logged decisions an impact run asks the candidate about: from the store, read-only,
or from an NDJSON export.

The store is never written. A LevelDB is copied first (LevelDB writes to the
directory it opens: its own log, a new manifest), while a shared lock on its
`LOCK` file keeps a service from opening it meanwhile; the copy is opened and
deleted afterwards. A PostgreSQL store is read through connections whose
transactions are read-only (`default_transaction_read_only`), so even a bug
here could not write. An export is the NDJSON of `GET /v1/decisions/export`
or `sessionstate decisions export`: each line an OPA decision log event with
the entry as stored under `sessionstate`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from service.decisions.bundle import BundleSelection
from service.decisions.reader import LAST_SEQ, DecisionLogReader
from service.decisions.review import DataDirBusy, ReviewError
from service.impact.compare import LoggedDecision
from service.impact.report import Verdict
from service.store_backend import StoreKind, StoreTarget
from store.backends.contract import Lanes
from store.backends.postgres import PostgresLaneStore
from store.chain.entry import parse_entry
from store.chain.keys import chain_name
from store.integrity import StoreUnavailable
from store.lanes import LaneStore


class ExportUnreadable(ReviewError):
    """The export file cannot be read as decision log events; names the line, never its text."""


def from_entry(entry: dict[str, Any]) -> LoggedDecision:
    """A decision as stored on the chain (a `DecisionLogEntry`'s JSON)."""
    decision = entry["decision"]
    target = entry.get("target") or {}
    engine = decision.get("engine") or {}
    policy_input = entry.get("input")
    return LoggedDecision(
        decision_id=str(decision["decision_id"]),
        tenant_id=target.get("tenant_id"),
        action=str(decision["action"]),
        evaluated_at=str(decision["evaluated_at"]),
        before=Verdict(allow=decision["allow"], reasons=sorted(set(decision["reasons"]))),
        input=policy_input if isinstance(policy_input, dict) else None,
        decided_by_opa=engine.get("name", "opa") == "opa",
    )


def from_event(event: dict[str, Any]) -> LoggedDecision:
    """A line of the export: the entry as stored when it is there, else OPA's fields."""
    stored = event.get("sessionstate")
    if isinstance(stored, dict):
        return from_entry(stored)
    policy_input = event.get("input")
    result = event["result"]
    return LoggedDecision(
        decision_id=str(event["decision_id"]),
        tenant_id=(policy_input or {}).get("target", {}).get("tenant_id"),
        action=str((policy_input or {}).get("action", "unknown")),
        evaluated_at=str(event["timestamp"]),
        before=Verdict(allow=result["allow"], reasons=sorted(set(result["reasons"]))),
        input=policy_input if isinstance(policy_input, dict) else None,
    )


def _selected(selection: BundleSelection, logged: LoggedDecision) -> bool:
    """The selection's filters over a decision (an export's events may not hold the entry)."""
    entry = {
        "decision": {"action": logged.action, "evaluated_at": logged.evaluated_at},
        "target": {"tenant_id": logged.tenant_id},
    }
    return selection.matches(entry)


def exported(path: Path, selection: BundleSelection) -> Generator[LoggedDecision]:
    """The export's decisions that the selection keeps, in file order."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as error:
        raise ExportUnreadable(
            f"cannot read the export {path}: {error.strerror or 'I/O error'}"
        ) from None
    with handle:
        number = 0
        try:
            for number, line in enumerate(handle, start=1):  # noqa: B007 - named on error
                if not line.strip():
                    continue
                logged = from_event(json.loads(line))
                if _selected(selection, logged):
                    yield logged
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ExportUnreadable(
                f"line {number} of {path} is not a sessionstate decision log event "
                "(the NDJSON of `sessionstate decisions export` or GET /v1/decisions/export)"
            ) from None


def stored(store: StoreTarget, selection: BundleSelection) -> Generator[LoggedDecision]:
    """The store's decisions that the selection keeps, chain by chain, read-only."""
    with _read_only_lanes(store) as lanes:
        reader = DecisionLogReader(lanes)
        names = (
            reader.chains() if selection.tenant_id is None else [chain_name(selection.tenant_id)]
        )
        for name in names:
            for _, raw in reader.chain(name).stored_entries(until_seq=LAST_SEQ):
                entry = _entry(raw)
                if entry is None:
                    continue  # the listing's rule: an unreadable entry is skipped (verify names it)
                if selection.matches(entry):
                    yield from_entry(entry)


def _entry(raw: bytes) -> dict[str, Any] | None:
    entry = parse_entry(raw)
    if entry is None or not isinstance(entry.get("decision"), dict):
        return None
    return entry


@contextmanager
def _read_only_lanes(store: StoreTarget) -> Iterator[Lanes]:
    if store.kind is StoreKind.POSTGRESQL:
        assert store.conninfo is not None
        shared = PostgresLaneStore(read_only_conninfo(store.conninfo))
        try:
            yield shared
        finally:
            shared.close()
        return
    assert store.leveldb_path is not None
    with tempfile.TemporaryDirectory(prefix="sessionstate-impact-") as scratch:
        copy = leveldb_copy(store.leveldb_path, Path(scratch) / "leveldb")
        try:
            lanes = LaneStore(copy)
        except StoreUnavailable as error:
            raise ReviewError(str(error)) from None
        try:
            yield lanes
        finally:
            lanes.close()


def read_only_conninfo(conninfo: str) -> str:
    """The connection string with every transaction read-only (`options=-c ...`)."""
    params = conninfo_to_dict(conninfo)
    options = str(params.get("options") or "")
    params["options"] = (options + " -c default_transaction_read_only=on").strip()
    return make_conninfo(**{name: str(value) for name, value in params.items()})


def leveldb_copy(database: Path, into: Path) -> Path:
    """A copy of the LevelDB at `database`, taken while no service can hold it."""
    if not (database / "CURRENT").is_file():
        raise FileNotFoundError(f"no sessionstate database at {database}")
    try:
        lock = os.open(database / "LOCK", os.O_RDONLY)
    except FileNotFoundError:
        lock = None
    try:
        if lock is not None:
            try:  # LevelDB holds a write lock on LOCK while it is open; a read lock conflicts
                fcntl.lockf(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                raise DataDirBusy(
                    f"cannot read {database}: the service (or another review) holds it; stop "
                    "it first, read a copy of the data dir, or give an export with --decisions"
                ) from None
        shutil.copytree(database, into, ignore=shutil.ignore_patterns("LOCK"))
    finally:
        if lock is not None:
            os.close(lock)
    return into
