"""The configured store at work: whether it answers and takes writes now (`/readyz`), and
its schema brought to this code's version (`sessionstate db upgrade`).

Which store is configured is `service.config.store`'s; what a store can do is asked
of its backend, never of its kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.config.store import VARIABLE, StoreTarget
from store.backends.contract import Lanes, StoreOffline, probes
from store.backends.registry import backend


def reachable(lanes: Lanes) -> bool:
    """Whether the store answers now (across the network: a probe; embedded: it is open)."""
    if probes(lanes):
        return lanes.reachable()
    return not lanes.closed


def takes_writes(lanes: Lanes) -> bool | None:
    """A store across the network: whether a probe write commits now, bounded. An embedded
    one: None, since this process alone writes it and `writable` says all there is to say."""
    if probes(lanes):
        return lanes.write_probe()
    return None


@dataclass(frozen=True)
class StoreUpgrade:
    """What `sessionstate db upgrade` did, as it prints it."""

    store: str
    target: str
    found: int | None
    now: int | None

    @property
    def changed(self) -> bool:
        return self.found != self.now


def upgrade(store: StoreTarget) -> StoreUpgrade:
    """Bring the configured store's schema to this code's version.

    PostgreSQL: create or upgrade its tables and record the version. LevelDB
    has no schema to upgrade yet (its version is `None`).
    """
    try:
        done = backend(store.kind).upgrade(store.location)
    except StoreOffline as error:
        raise StoreOffline(f"{error} ({VARIABLE})") from None
    return StoreUpgrade(store.kind, store.target, done.found, done.now)
