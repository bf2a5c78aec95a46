"""No rollback: a signed bundle older than the newest one activated on the deployment is refused.

`sessionstate policy build --serial N` writes N into the bundle's `.manifest`
(`metadata.sessionstate.serial`), and OPA's signature covers `.manifest` as it
covers every file (`.signatures.json` lists its hash): a serial cannot be
changed without OPA refusing the bundle. The highest serial OPA activated on
the deployment, with the revision that carried it, is kept in the store (the
`trace_meta` lane, outside every tenant's chain), so replicas sharing a
PostgreSQL store share it and a restart remembers it. A candidate is refused,
`policy_bundle_rollback`, when

- its serial is below the highest (an older bundle put back);
- its serial is the highest but its revision is not (another bundle claiming
  the same number);
- it carries no serial (built by a release before serials, or not by
  `policy build`): rebuild it with `policy build --serial N`;

unless `SESSIONSTATE_POLICY_BUNDLE_PIN` names its revision exactly: then it is
served, and its activation is logged (`policy_bundle_pinned`). A pinned
bundle never lowers the highest serial.

The serial is read before OPA has verified the signature. That is safe both
ways: a forged serial that would pass is then refused by OPA with the rest of
the bundle, and only a serial OPA activated is ever recorded, so a forged high
one cannot lock the deployment out of its own bundles.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from store.backends.contract import ExpectationFailed, Lanes
from store.canonical import canonical_json
from store.chain.head import format_timestamp
from store.chain.keys import LEGACY_CHAIN
from store.key_codec import LaneKey, TenantResourceLane

log = logging.getLogger("sessionstate.policy")
ROLLBACK = "policy_bundle_rollback"
PIN_SETTING = "SESSIONSTATE_POLICY_BUNDLE_PIN"
HIGHEST_KEY = LaneKey(TenantResourceLane.TRACE_META, LEGACY_CHAIN, name=b"policy_bundle_serial")
UPDATE_ATTEMPTS = 16


class Highest(BaseModel):
    """The highest serial activated on the deployment, and the bundle revision that had it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    serial: int = Field(ge=1)
    revision: str = Field(min_length=1)
    at: str = Field(description="RFC 3339: when it was first activated")


class HighestUnreadable(RuntimeError):
    """The record of the highest serial is in the store but does not read."""


def stored_highest(lanes: Lanes) -> Highest | None:
    """The record as stored; None when there is none yet. `HighestUnreadable` when damaged."""
    return _parsed(lanes.get(HIGHEST_KEY))


def _parsed(raw: bytes | None) -> Highest | None:
    if raw is None:
        return None
    try:
        return Highest.model_validate_json(raw)
    except ValidationError:
        raise HighestUnreadable("the store's record of the highest bundle serial") from None


def record_highest(lanes: Lanes, activated: Highest) -> Highest:
    """Keep `activated` if its serial is above the stored one; the record kept, either way.
    Other replicas may record at once: a batch that expects the record as read."""
    for _ in range(UPDATE_ATTEMPTS):
        raw = lanes.get(HIGHEST_KEY)
        try:
            current = _parsed(raw)
        except HighestUnreadable:
            current = None  # OPA just activated a bundle (pinned, then): it replaces the wreck
        if current is not None and current.serial >= activated.serial:
            return current
        try:
            with lanes.batch(sync=True) as batch:
                batch.expect(HIGHEST_KEY, raw)
                batch.put(HIGHEST_KEY, canonical_json(activated.model_dump(mode="json")))
        except ExpectationFailed:  # another replica recorded first: read again
            continue
        return activated
    raise RuntimeError("other replicas kept changing the highest bundle serial")


def refusal(serial: int | None, revision: str, highest: Highest | None) -> str | None:
    """Why a bundle with this serial and revision would be a rollback; None when it is not."""
    if serial is None:
        return (
            "the bundle carries no serial (built by an older release, or not by `sessionstate "
            "policy build`): rebuild it with `sessionstate policy build --serial N`"
        )
    if highest is None or serial > highest.serial:
        return None
    if serial == highest.serial and revision == highest.revision:
        return None
    if serial == highest.serial:
        return (
            f"its serial {serial} is the one revision {highest.revision} already carries on "
            "this deployment: a different bundle claims the same number"
        )
    return (
        f"its serial {serial} is below {highest.serial}, the highest activated on this "
        f"deployment (revision {highest.revision})"
    )


class RollbackGuard:
    """What a signed bundle source asks before it offers a bundle, and tells once OPA took it.

    Until a store is attached (`attach`), what it knows is what this process activated;
    once attached, every check reads the store (another replica may have gone further),
    and an activation not recorded yet (the store was away) is recorded then.
    """

    def __init__(self, pin: str | None = None, clock: Callable[[], datetime] | None = None):
        self.pin = pin
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lanes: Lanes | None = None
        self._highest: Highest | None = None
        self._unrecorded: Highest | None = None
        self._lock = threading.Lock()

    def attach(self, lanes: Lanes | None) -> None:
        """Where the highest serial is kept from now on (None: nowhere, until attached)."""
        with self._lock:
            self._lanes = lanes
            if lanes is not None and self._unrecorded is not None:
                self._record(self._unrecorded)

    def check(self, serial: int | None, revision: str) -> str | None:
        """None when the bundle may be offered to OPA; else why not: a rollback, or a store
        that cannot say what the highest serial is (refused too: fail closed)."""
        with self._lock:
            try:
                why = refusal(serial, revision, self._known())
            except HighestUnreadable as error:
                why = f"{error} does not read"
            except Exception as error:
                return (
                    "the highest bundle serial activated on this deployment cannot be read "
                    f"from the store ({type(error).__name__})"
                )
            if why is None or self.pin == revision:
                return None
            return f"{why}; to serve it anyway, set {PIN_SETTING}={revision}"

    def activated(self, serial: int | None, revision: str) -> None:
        """OPA activated it: log a pin that let it through, raise the highest serial."""
        with self._lock:
            highest = self._highest
            if refusal(serial, revision, highest) is not None:
                log.warning(
                    "policy_bundle_pinned",
                    extra={
                        "policy_revision": revision,
                        "serial": serial,
                        "highest_serial": None if highest is None else highest.serial,
                    },
                )
                return  # a pinned bundle never lowers, nor raises, the highest serial
            if serial is None or (highest is not None and serial <= highest.serial):
                return
            self._highest = Highest(
                serial=serial, revision=revision, at=format_timestamp(self._clock())
            )
            self._record(self._highest)

    def _known(self) -> Highest | None:
        if self._lanes is not None:
            self._highest = self._merged(stored_highest(self._lanes))
        return self._highest

    def _merged(self, stored: Highest | None) -> Highest | None:
        known = self._highest
        if stored is None or (known is not None and known.serial > stored.serial):
            return known
        return stored

    def _record(self, highest: Highest) -> None:
        lanes = self._lanes
        if lanes is None:
            self._unrecorded = highest
            return
        try:
            self._highest = self._merged(record_highest(lanes, highest))
            self._unrecorded = None
        except Exception as error:
            self._unrecorded = highest  # recorded once a store takes it (the next attach)
            log.error(
                "policy_bundle_serial_not_recorded", extra={"error_type": type(error).__name__}
            )
