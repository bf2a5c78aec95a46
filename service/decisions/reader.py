"""`DecisionLogReader`: the decision log as reviewers read it, for every way they read it.

The JSON routes, the reviewer's page, the evidence bundle and the offline review
commands all read through one reader: a tenant's entries (its own chain) in
chain order, pages and their cursors, one entry by decision id within one
tenant's chain, the NDJSON export, the newest entries, and the stored bytes a
bundle ships. Every read names its chain (`chain_name(tenant_id)`); only the
offline operator commands read every chain.

An entry that does not have the shape of one is skipped with a warning (never
its content): a listing shows what it can, and `verify` names what was
tampered with.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from service.contract import DECISION_ID
from service.decisions.log import DecisionLogEntry, decision_id_key, opa_event
from service.decisions.query import DecisionQuery, encode_cursor
from store.backends.contract import Lanes
from store.chain_head import ChainHead
from store.chain_loss import LOSS_MEMBER
from store.evidence_chain import EvidenceChain, chain_names, parse_entry

log = logging.getLogger("sessionstate.decisions")
EVERYTHING = DecisionQuery()
LAST_SEQ = (1 << 64) - 1  # the largest seq an entry key can hold: "to the end"


@dataclass(frozen=True)
class DecisionPage:
    """One page of a tenant's entries, and the cursor of the next (None at the end)."""

    entries: list[DecisionLogEntry]
    next_cursor: str | None


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
        """The chain's entries in the query's window, in chain order, that pass its filters."""
        for entry, _ in self._selected(tenant, query, until):
            yield entry

    def page(self, tenant: str, query: DecisionQuery) -> DecisionPage:
        """Up to `query.limit` entries after the query's cursor, ending at the first page's head.

        Seeks to the cursor: a deep page reads what a first one does (with filters, the
        entries it skips that do not pass them too)."""
        selected, next_cursor = self._page(tenant, query)
        return DecisionPage([entry for entry, _ in selected], next_cursor)

    def export_page(self, tenant: str, query: DecisionQuery) -> tuple[list[str], str | None]:
        """The export's lines of one page (as `page` selects it), and the next page's cursor."""
        selected, next_cursor = self._page(tenant, query)
        lines = [json.dumps(opa_event(entry, stored)) + "\n" for entry, stored in selected]
        return lines, next_cursor

    def _page(
        self, tenant: str, query: DecisionQuery
    ) -> tuple[list[tuple[DecisionLogEntry, dict[str, Any]]], str | None]:
        cursor_until = query.window()[1]
        until = self._head(tenant).seq if cursor_until is None else cursor_until
        page: list[tuple[DecisionLogEntry, dict[str, Any]]] = []
        for selected in self._selected(tenant, query, until):
            if len(page) == query.limit:
                return page, encode_cursor(page[-1][0].seq, until)
            page.append(selected)
        return page, None

    def get(self, tenant: str, decision_id: str) -> DecisionLogEntry | None:
        """The entry of a decision id on the tenant's chain; None when it is not on it
        (whether it is on another chain or nowhere reads the same)."""
        if DECISION_ID.fullmatch(decision_id) is None:
            return None
        stored_seq = self._lanes.get(decision_id_key(tenant, decision_id))
        if stored_seq is None:
            return None
        seq = int.from_bytes(stored_seq, "big")
        read = _readable(self.chain(tenant).get(seq), seq)
        return None if read is None else read[0]

    def export(self, tenant: str | None, query: DecisionQuery = EVERYTHING) -> Iterator[str]:
        """NDJSON lines in OPA's decision log field names, each with its entry as stored.

        One tenant's entries, or every chain's, one after another, with `tenant` None
        (offline review only).
        """
        for name in self.chains() if tenant is None else [tenant]:
            for entry, stored in self._selected(name, query, None):
                yield json.dumps(opa_event(entry, stored)) + "\n"

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
    ) -> Iterator[tuple[DecisionLogEntry, dict[str, Any]]]:
        """Readable entries of the window that pass the filters, with each as stored."""
        after, cursor_until = query.window()
        until = cursor_until if until is None else until
        last = LAST_SEQ if until is None else until
        for seq, stored in self.chain(tenant).stored_entries(after_seq=after, until_seq=last):
            read = _readable(parse_entry(stored), seq)
            if read is not None and query.matches(read[0]):
                yield read


def _readable(
    stored: dict[str, Any] | None, seq: int
) -> tuple[DecisionLogEntry, dict[str, Any]] | None:
    """The entry, and what was stored, when it has the shape of an entry; else None."""
    if stored is None or LOSS_MEMBER in stored:  # a recorded loss is no decision (verify says)
        return None
    try:
        return DecisionLogEntry.model_validate(stored), stored
    except ValidationError:
        log.warning("unreadable_decision_entry", extra={"seq": seq})
        return None
