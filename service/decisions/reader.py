"""`DecisionLogReader`: the decision log as reviewers read it, for every way they read it.

The JSON routes, the reviewer's page, the evidence bundle and the offline review
commands all read through one reader: a tenant's entries (its own chain) in
chain order, pages and their cursors, one entry by decision id within one
tenant's chain, the NDJSON export, the newest entries, and the stored bytes a
bundle ships. Every read names its chain (`chain_name(tenant_id)`); only the
offline operator commands read every chain.

Every entry read is returned as stored (`DecisionLogEntry.as_stored`): it
serializes member for member as the chain holds it, so it hashes as it did when
sealed. An entry that does not have the shape of one is skipped with a warning
(never its content): a listing shows what it can, and `verify` names what was
tampered with.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from service.api.v1 import DECISION_ID
from service.decisions.log import DecisionLogEntry, decision_id_key, opa_event
from service.decisions.query import DecisionQuery
from store.backends.contract import Lanes
from store.chain.entry import parse_entry
from store.chain.evidence import EvidenceChain
from store.chain.head import ChainHead
from store.chain.keys import chain_names
from store.chain.loss import LOSS_MEMBER

log = logging.getLogger("sessionstate.decisions")
EVERYTHING = DecisionQuery()
LAST_SEQ = (1 << 64) - 1  # the largest seq an entry key can hold: "to the end"


@dataclass(frozen=True)
class DecisionPage:
    """One page of a tenant's entries, and the cursor of the next (None at the end)."""

    entries: list[DecisionLogEntry]
    next_cursor: str | None


@dataclass(frozen=True)
class FoundEntry:
    """One entry looked up by decision id, and whether it holds where it is on its chain:
    its own hash, and its link to the entry before it (`EvidenceChain.links`)."""

    entry: DecisionLogEntry
    hash_ok: bool


class DecisionLogReader:
    """Reads the decision log of one store; `head(chain)` is where a first page ends (the
    journal's, kept in memory, in a running service; the stored chain's otherwise)."""

    def __init__(self, lanes: Lanes, *, head: Callable[[str], ChainHead] | None = None) -> None:
        self._lanes = lanes
        self._head = head or (lambda name: self.chain(name).head())

    def chain(self, name: str) -> EvidenceChain:
        """One tenant's chain (`chain_name(tenant_id)`)."""
        return EvidenceChain(self._lanes, name)

    def chains(self) -> list[str]:
        """Every chain's name: for operators, who review every tenant."""
        return chain_names(self._lanes)

    def head(self, name: str) -> ChainHead:
        return self._head(name)

    def entries(
        self, tenant: str, query: DecisionQuery = EVERYTHING, *, until: int | None = None
    ) -> Iterator[DecisionLogEntry]:
        """The chain's entries in the query's window and order, that pass its filters."""
        yield from self._selected(tenant, query, until)

    def page(self, tenant: str, query: DecisionQuery) -> DecisionPage:
        """Up to `query.limit` entries after the query's cursor, in the query's order, within
        the head the first page saw.

        Seeks to the cursor: a deep page reads what a first one does (with filters, the
        entries it skips that do not pass them too)."""
        after, cursor_until = query.window()
        until = self._head(tenant).seq if cursor_until is None else cursor_until
        page: list[DecisionLogEntry] = []
        for entry in self._selected(tenant, query, until):
            if len(page) == query.limit:
                return DecisionPage(page, query.next_cursor(page[-1].seq, after, until))
            page.append(entry)
        return DecisionPage(page, None)

    def export_page(self, tenant: str, query: DecisionQuery) -> tuple[list[str], str | None]:
        """The export's lines of one page (as `page` selects it), and the next page's cursor."""
        page = self.page(tenant, query)
        return [_export_line(entry) for entry in page.entries], page.next_cursor

    def get(self, tenant: str, decision_id: str) -> FoundEntry | None:
        """The entry of a decision id on the tenant's chain, and whether it holds there; None
        when it is not on it (whether it is on another chain or nowhere reads the same)."""
        if DECISION_ID.fullmatch(decision_id) is None:
            return None
        stored_seq = self._lanes.get(decision_id_key(tenant, decision_id))
        if stored_seq is None:
            return None
        seq = int.from_bytes(stored_seq, "big")
        chain = self.chain(tenant)
        stored = chain.get(seq)
        entry = _readable(stored, seq)
        if stored is None or entry is None:
            return None
        return FoundEntry(entry, chain.links(seq, stored))

    def export(self, tenant: str | None, query: DecisionQuery = EVERYTHING) -> Iterator[str]:
        """NDJSON lines in OPA's decision log field names, each with its entry as stored.

        One tenant's entries, or every chain's, one after another, with `tenant` None
        (offline review only).
        """
        for name in self.chains() if tenant is None else [tenant]:
            for entry in self._selected(name, query, None):
                yield _export_line(entry)

    def newest(self, count: int) -> list[dict[str, Any]]:
        """The newest `count` entries of every chain as stored, oldest first (by recorded_at)."""
        newest: list[dict[str, Any]] = []
        for name in self.chains():
            for index, entry in enumerate(self.chain(name).scan(reverse=True)):
                if index == count:
                    break
                newest.append(entry)
        newest.sort(key=lambda entry: str(entry.get("recorded_at")))
        return newest[-count:] if count else []

    def stored(self, tenant: str, *, until_seq: int) -> Iterator[tuple[int, bytes]]:
        """(seq, bytes exactly as stored) of every entry of the chain up to until_seq."""
        return self.chain(tenant).stored_entries(until_seq=until_seq)

    def _selected(
        self, tenant: str, query: DecisionQuery, until: int | None
    ) -> Iterator[DecisionLogEntry]:
        """Readable entries of the window that pass the filters, in the query's order."""
        after, cursor_until = query.window()
        until = cursor_until if until is None else until
        last = LAST_SEQ if until is None else until
        stored_entries = self.chain(tenant).stored_entries(
            after_seq=after, until_seq=last, reverse=query.order == "desc"
        )
        for seq, stored in stored_entries:
            entry = _readable(parse_entry(stored), seq)
            if entry is not None and query.matches(entry):
                yield entry


def _readable(stored: dict[str, Any] | None, seq: int) -> DecisionLogEntry | None:
    """The entry as stored, when it has the shape of an entry; else None."""
    if stored is None or LOSS_MEMBER in stored:  # a recorded loss is no decision (verify says)
        return None
    try:
        return DecisionLogEntry.as_stored(stored)
    except ValidationError:
        log.warning("unreadable_decision_entry", extra={"seq": seq})
        return None


def _export_line(entry: DecisionLogEntry) -> str:
    """One NDJSON line of the export: the entry as an OPA decision log event."""
    return json.dumps(opa_event(entry)) + "\n"
