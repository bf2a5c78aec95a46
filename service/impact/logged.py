"""The logged decisions an impact run asks the candidate about: from the store, read-only,
or from an NDJSON export.

The store is never written: it is opened in the `read_only` mode. A LevelDB is
copied first (LevelDB writes to the directory it opens: its own log, a new
manifest), while a shared lock on its `LOCK` file keeps a service from opening
it meanwhile; the copy is opened and deleted afterwards. A PostgreSQL store is
read through connections whose transactions are read-only
(`default_transaction_read_only`), so even a bug here could not write. An export is the NDJSON of `GET /v1/decisions/export`
or `sessionstate decisions export`: each line an OPA decision log event with
the entry as stored under `sessionstate`.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.config.store import StoreTarget
from service.decisions.evidence_bundle import BundleSelection
from service.decisions.reader import LAST_SEQ, DecisionLogReader
from service.decisions.review import DataDirBusy, ReviewError
from service.impact.compare import LoggedDecision
from service.impact.report import Verdict
from store.backends.contract import Lanes, Mode
from store.chain.entry import parse_entry
from store.chain.keys import chain_name
from store.embedded.integrity import StoreBusy, StoreUnavailable


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
    try:
        lanes = store.open(Mode.READ_ONLY)
    except StoreBusy:
        raise DataDirBusy(
            f"cannot read {store.target}: the service (or another review) holds it; stop "
            "it first, read a copy of the data dir, or give an export with --decisions"
        ) from None
    except StoreUnavailable as error:
        raise ReviewError(str(error)) from None
    try:
        yield lanes
    finally:
        lanes.close()
