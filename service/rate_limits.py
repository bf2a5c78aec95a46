"""`ActorRateLimiter`: per-actor budgets, checked after authentication and before any policy call.

An actor is a verified token's subject together with its tenant claim. It
has two budgets, counted by the `limits` package in this process's memory:

- `requests`: every request that reaches a policy decision. Generous: a
  model service serving many sessions under one subject must never feel it.
  Counted as a sliding window (two counters a key, whatever the rate).
- `denials`: policy denials of requests outside the actor's own scope
  (another tenant, workspace or session than its token names, or a token
  naming no tenant). Tight: those are what grow *another* tenant's decision
  log. Counted as an exact moving window, so no window ever holds more.

A denial inside the actor's own scope (durable writes off, no approval, a
record the policy refuses) is ordinary traffic of that actor, like an
allowed request: a model service whose writes are refused and fall back to
previews must not be throttled for it.

A caller whose token did not verify (`POST /v1/token` with a bad subject
token: the anonymous actor) has no subject to be counted by: its budgets are
its client address's (`peer_key`: the socket's peer, an IPv6 address by its
/64), so one address's flood never spends another's. The addresses are kept
as an LRU of at most `PEERS_KEPT`; the least recently seen one is forgotten,
budgets and all, when another comes.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

from service.auth.tokens import Actor
from service.policy.input import PolicyTarget

Budget = Literal["requests", "denials"]
OFF = "off"
MAX_SUMMARY_WINDOW_SECONDS = 3600  # a limited actor shows in the log within the hour
PEERS_KEPT = 4096  # client addresses with budgets of their own, the least recent forgotten
IPV6_CLIENT_PREFIX = 64  # one IPv6 client holds a /64 at least: counted as one address


def parse_budget(text: str) -> tuple[RateLimitItem, ...]:
    """Limits in the `limits` notation ("500/second;15000/minute"), or none for "off".

    Raises ValueError with a fixed message (the `limits` parser's own quotes the text).
    """
    if text.strip().lower() == OFF:
        return ()
    try:
        items = tuple(parse_many(text))
    except ValueError:
        raise ValueError("not a rate limit") from None
    if not items or any(item.amount < 1 for item in items):
        raise ValueError("not a rate limit")
    return items


@dataclass(frozen=True)
class RateLimits:
    """The configured budgets of every actor; an empty budget is off."""

    requests: tuple[RateLimitItem, ...]
    denials: tuple[RateLimitItem, ...]

    def describe(self) -> dict[str, str]:
        """The budgets as the decision log names them, e.g. {"denials": "20 per 1 minute"}."""
        return {
            "requests": "; ".join(str(item) for item in self.requests) or OFF,
            "denials": "; ".join(str(item) for item in self.denials) or OFF,
        }

    @property
    def summary_window_seconds(self) -> int:
        """How long one summary of an actor's refused requests collects them."""
        windows = [item.get_expiry() for item in (*self.requests, *self.denials)]
        return min(max(windows, default=1), MAX_SUMMARY_WINDOW_SECONDS)


@dataclass(frozen=True)
class Refusal:
    """Why an actor's request is refused, and when the budget has room again."""

    budget: Budget
    retry_after: int  # whole seconds, at least 1


class RateLimited(Exception):
    """An actor over its budget: refused before any policy call, nothing was done."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"rate limited: {refusal.budget}")
        self.refusal = refusal


class ActorRateLimiter:
    """Counts each actor's requests and out-of-scope denials against its budgets.

    `peer`, where a method takes it, is the client address of a caller whose token did
    not verify (None for a verified actor): that address's budgets count its requests.
    """

    def __init__(self, limits: RateLimits, *, peers_kept: int = PEERS_KEPT) -> None:
        self.limits = limits
        storage = MemoryStorage()
        self._requests = SlidingWindowCounterRateLimiter(storage)
        self._denials = MovingWindowRateLimiter(storage)
        self._peers: OrderedDict[str, None] = OrderedDict()
        self._peers_kept = peers_kept
        self._peers_guard = threading.Lock()

    def admit(self, actor: Actor, *, peer: str | None = None) -> Refusal | None:
        """None when the actor may be decided now (and the request is counted), else why not.

        A spent denial budget refuses without counting the request; a refused
        request takes nothing from the request budget.
        """
        key = self._key(actor, peer)
        for item in self.limits.denials:
            if not self._denials.test(item, "denials", key):
                reset, _ = self._denials.get_window_stats(item, "denials", key)
                return Refusal("denials", _seconds_until(reset))
        for item in self.limits.requests:
            if not self._requests.hit(item, "requests", key):
                reset, _ = self._requests.get_window_stats(item, "requests", key)
                return Refusal("requests", _seconds_until(reset))
        return None

    def charge_denial(self, actor: Actor, target: PolicyTarget, *, peer: str | None = None) -> None:
        """Count a policy denial against the denial budget, when it reached outside the actor."""
        if within_scope(actor, target):
            return
        key = self._key(actor, peer)
        for item in self.limits.denials:
            self._denials.hit(item, "denials", key)

    def _key(self, actor: Actor, peer: str | None) -> str:
        if peer is None:
            return actor_key(actor)
        key = peer_key(peer)
        with self._peers_guard:
            self._peers[key] = None
            self._peers.move_to_end(key)
            forgotten = (
                self._peers.popitem(last=False)[0] if len(self._peers) > self._peers_kept else None
            )
        if forgotten is not None:
            self._forget(forgotten)
        return key

    def _forget(self, key: str) -> None:
        for item in self.limits.requests:
            self._requests.clear(item, "requests", key)
        for item in self.limits.denials:
            self._denials.clear(item, "denials", key)


def actor_key(actor: Actor) -> str:
    """A fixed-size key per (subject, tenant): no delimiter in a subject can alias another."""
    named = f"{len(actor.sub)}:{actor.sub}|{actor.tenant_id or ''}"
    return hashlib.sha256(named.encode()).hexdigest()


def peer_key(address: str) -> str:
    """A fixed-size key per client address (an IPv6 one by its /64, an IPv4-mapped one as
    IPv4; anything else is one "unknown" address), never equal to an actor's key."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        named = "unknown"
    else:
        if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
            parsed = parsed.ipv4_mapped
        if isinstance(parsed, ipaddress.IPv6Address):
            named = str(ipaddress.IPv6Network((parsed, IPV6_CLIENT_PREFIX), strict=False))
        else:
            named = str(parsed)
    # An actor's key hashes "<digits>:…", this one "peer|…": the two never meet.
    return hashlib.sha256(f"peer|{named}".encode()).hexdigest()


def within_scope(actor: Actor, target: PolicyTarget) -> bool:
    """Whether the target lies inside every scope claim of the actor's token."""
    if actor.tenant_id is None or actor.tenant_id != target.tenant_id:
        return False
    if actor.workspace_id is not None and actor.workspace_id != target.workspace_id:
        return False
    return actor.session_id is None or actor.session_id == target.session_id


def _seconds_until(reset: float) -> int:
    return max(1, math.ceil(reset - time.time()))
