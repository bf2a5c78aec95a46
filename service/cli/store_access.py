"""The store as the offline subcommands open it: for review, and under the service's own lock
on the data dir where only one process may hold it."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.config.key_ids import hold_key_ids
from service.config.settings import Settings
from service.config.store import configured_store
from service.decisions import review as decision_review
from service.policy.reload import LOCK_FILE
from store.backends.contract import Lanes
from store.embedded.integrity import StoreBusy


@contextmanager
def holding_data_dir(data_dir: Path, database: Path) -> Iterator[None]:
    """The service's own lock on the data dir: LevelDB's is free for a moment as it starts."""
    with open(data_dir / LOCK_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreBusy(database) from None
        yield


@contextmanager
def review_lanes(settings: Settings) -> Iterator[Lanes]:
    """The store to review: PostgreSQL read while the service runs, by its own client; a
    LevelDB data dir only while no service holds it (`decision_review.open_store`). Keys
    other than those the store recorded are refused (`hold_key_ids`), so no command
    signs, proves or prints a key of another identity against it."""
    with decision_review.open_store(configured_store(settings), settings.data_dir) as lanes:
        hold_key_ids(lanes, settings, review=True)
        yield lanes
