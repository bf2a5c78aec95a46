"""Which store the service keeps its lanes in: `SESSIONSTATE_STORE`, parsed into a `StoreTarget`.

Unset, the lanes live in the embedded store under the data dir
(`store.backends.registry.EMBEDDED`, LevelDB). Set, they live in the backend
that claims the value: a libpq connection string (a `postgresql://` URI or
`key=value` pairs, multi-host ones included) names a PostgreSQL database
(`store.backends.postgres`). The connection string may carry a password: it
is never printed, logged or reported; `StoreTarget.target` is what may be
shown (`host:port/db`, without user or password). What a store can do is
asked of its backend's `Capabilities`, never of its kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from service.config.configuration_error import ConfigurationError
from service.config.settings import Settings
from store.backends.contract import Capabilities, Lanes, LocationInvalid, Mode
from store.backends.registry import EMBEDDED, backend, claiming, embedded_location, setting_forms

VARIABLE = "SESSIONSTATE_STORE"


@dataclass(frozen=True)
class StoreTarget:
    """The configured store: its backend's name, what may be shown of it, where it is."""

    kind: str  # the backend's registered name (`leveldb`, `postgresql`)
    target: str  # LevelDB: its directory; PostgreSQL: host:port/db, no user, no password
    location: str = field(repr=False)  # what opens it; a connection string is a secret

    @property
    def capabilities(self) -> Capabilities:
        return backend(self.kind).CAPABILITIES

    @property
    def present(self) -> bool:
        """Whether there is a store to open (the embedded one may not be made yet)."""
        return backend(self.kind).present(self.location)

    def open(self, mode: Mode = Mode.SERVE) -> Lanes:
        """Open it for mode (PostgreSQL: `StoreOffline`, `SchemaMismatch` on the way)."""
        return backend(self.kind).open(self.location, mode)


def embedded_target(data_dir: Path) -> StoreTarget:
    """The store in the data dir, which holds the lanes when `SESSIONSTATE_STORE` is unset."""
    location = embedded_location(data_dir)
    return StoreTarget(EMBEDDED.NAME, EMBEDDED.shown(location), location)


def configured_store(settings: Settings) -> StoreTarget:
    """SESSIONSTATE_STORE, parsed: the embedded LevelDB, or a PostgreSQL database; a value
    that cannot be one is a `ConfigurationError`."""
    text = settings.store
    if text is None:
        return embedded_target(settings.data_dir)
    text = text.strip()
    if not text:
        raise ConfigurationError(
            f"{VARIABLE} is empty: unset it for the embedded LevelDB, "
            "or set a PostgreSQL connection string"
        )
    found = claiming(text)
    if found is None:
        raise ConfigurationError(f"{VARIABLE} must be {setting_forms()}")
    try:
        return StoreTarget(found.NAME, found.shown(text), text)
    except LocationInvalid as error:
        raise ConfigurationError(f"{VARIABLE} {error}") from None
