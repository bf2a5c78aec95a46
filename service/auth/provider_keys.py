"""The identity provider's signing keys (SESSIONSTATE_JWT_JWKS_URL), fetched so that a slow
or broken provider costs one fetch at a time and never a queue of request threads.

PyJWKClient does the HTTP and reads the set (no redirects, http(s) only, the
keys that sign and name a `kid`); this module decides when it is asked:

- A set is used for `cache_seconds` from the start of the fetch that got it,
  and not after: a key the provider withdrew verifies nothing once that time
  is up. From half that age on, the first request that uses it starts a fetch
  in the background and goes on with the set it has.
- One fetch at a time (single flight), on a thread of its own, given up after
  `timeout_seconds` as a whole. A fetch given up may go on (urllib bounds each
  read, not the whole: a provider that trickles bytes keeps it alive); no other
  starts until it ends, so such a provider holds one thread and one connection. The request that started it waits for it, at
  most that long; any other request that needs what the fetch may bring (no
  set young enough, or a `kid` the set lacks) fails at once with
  `KeysUnavailable`: no request thread waits behind the provider.
- After a fetch, whether it succeeded or failed, a `kid` the set lacks is
  `UnknownKey` for `cooldown_seconds` without another fetch; after a failed
  one, nothing starts a fetch for that long: a flood of made-up `kid`s costs
  the provider at most one fetch per cooldown.
- Anything but a JSON object holding at least one usable signing key is a
  failed fetch: no answer in time, a status other than 200, a body that is
  not JSON, a malformed set.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from jwt import PyJWK, PyJWKClient


class KeysUnavailable(Exception):
    """No key set young enough, and none could be had now."""


class UnknownKey(Exception):
    """The current key set has no signing key of that `kid`."""


@dataclass(frozen=True)
class _KeySet:
    keys: dict[str, PyJWK]
    fetched_at: float  # when the fetch that got it started (time.monotonic)


@dataclass
class _Flight:
    started: float
    deadline: float
    done: threading.Event = field(default_factory=threading.Event)


class ProviderKeys:
    """The signing keys of one JWKS URL, by `kid`."""

    def __init__(
        self, url: str, *, cache_seconds: float, cooldown_seconds: float, timeout_seconds: float
    ) -> None:
        self._client = PyJWKClient(url, cache_jwk_set=False, timeout=timeout_seconds)
        self._cache_seconds = cache_seconds
        self._cooldown = cooldown_seconds
        self._timeout = timeout_seconds
        self._stray: _Flight | None = None  # the last fetch given up, while it runs
        self._guard = threading.Lock()
        self._set: _KeySet | None = None
        self._flight: _Flight | None = None
        self._last_fetch: float | None = None  # when the last fetch ended, or was given up
        self._last_failed = False

    def key(self, kid: str) -> PyJWK:
        """The signing key `kid`; raises `UnknownKey` or `KeysUnavailable`."""
        with self._guard:
            started = self._fetch_for(kid)
        if started is not None:  # this request started the fetch: it waits for it, bounded
            started.done.wait(self._timeout)
        with self._guard:
            return self._known(kid)

    def _fresh(self, now: float) -> _KeySet | None:
        current = self._set
        if current is None or now - current.fetched_at >= self._cache_seconds:
            return None
        return current

    def _fetch_for(self, kid: str) -> _Flight | None:
        """A fetch this request starts and waits for; or None (a background refresh of a set
        getting old is started without waiting)."""
        now = time.monotonic()
        self._give_up_late_flight(now)
        current = self._fresh(now)
        idle = self._flight is None and not self._straying() and self._may_fetch(now, current)
        if current is not None and kid in current.keys:
            if idle and now - current.fetched_at >= self._cache_seconds / 2:
                self._start(now)
            return None
        return self._start(now) if idle else None

    def _known(self, kid: str) -> PyJWK:
        now = time.monotonic()
        self._give_up_late_flight(now)
        current = self._fresh(now)
        if current is not None and kid in current.keys:
            return current.keys[kid]
        if current is None or self._flight is not None:
            raise KeysUnavailable
        raise UnknownKey

    def _may_fetch(self, now: float, current: _KeySet | None) -> bool:
        """A set too old is fetched again unless a fetch failed within the cooldown; an
        unknown `kid` makes a fetch only once the cooldown after any fetch is over."""
        if self._last_fetch is None or now - self._last_fetch >= self._cooldown:
            return True
        return current is None and not self._last_failed

    def _start(self, now: float) -> _Flight:
        flight = _Flight(started=now, deadline=now + self._timeout)
        self._flight = flight
        threading.Thread(target=self._fly, args=(flight,), name="jwks-fetch", daemon=True).start()
        return flight

    def _fly(self, flight: _Flight) -> None:
        try:
            signing = self._client.get_signing_keys()
            # The first key of a `kid` wins, as PyJWKClient's own lookup has it.
            keys = {key.key_id: key for key in reversed(signing) if isinstance(key.key_id, str)}
        except Exception:  # any failure of a fetch is the same: no keys from it
            keys = {}
        with self._guard:
            if self._flight is flight:  # not given up meanwhile: a late answer is dropped
                self._ended(failed=not keys)
                if keys:
                    self._set = _KeySet(keys, fetched_at=flight.started)
        flight.done.set()

    def _give_up_late_flight(self, now: float) -> None:
        if self._flight is not None and now >= self._flight.deadline:
            self._stray = self._flight  # its thread may go on (a trickling provider)
            self._ended(failed=True)

    def _straying(self) -> bool:
        """Whether a fetch given up is still running: no other starts beside it, so a
        provider that trickles bytes holds one thread and one connection, never more."""
        stray = self._stray
        return stray is not None and not stray.done.is_set()

    def _ended(self, *, failed: bool) -> None:
        self._flight = None
        self._last_fetch = time.monotonic()
        self._last_failed = failed
