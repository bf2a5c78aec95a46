"""`WorkerBeats`: one `/readyz` answer for every worker of `serve --workers N`.

Each worker writes a beat of its own into the workers' directory of the data dir
(`workers/beats/<slot>.json`: its pid, when, whether its store is open and takes writes)
when it starts serving and then every BEAT_SECONDS, from its event loop, so a worker whose
loop is stuck stops beating. The worker that answers `/readyz` probes OPA and the store
itself (every worker asks the same sidecar and the same PostgreSQL) and reads the others'
beats: a slot whose worker is not running (its beat is missing, or names a process that is
gone: it died, or is being started again), stopped beating (none for STALE_SECONDS), or
whose store is closed or latched read-only makes the answer `503` with
`worker_unavailable`, whichever worker gives it. The parent removes a dead worker's beat.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from store.backends.contract import Lanes

BEATS_DIR = "beats"
BEAT_SECONDS = 1.0
STALE_SECONDS = 5.0  # five beats missed: the worker is not serving
WORKER_UNAVAILABLE = "worker_unavailable"


class Beat(BaseModel):
    """What a worker says of itself at each beat."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pid: int
    at: float  # Unix time
    store_open: bool
    store_writable: bool


class WorkerBeats:
    """A worker's own beat, and the others' as its `/readyz` reads them."""

    def __init__(self, directory: Path, slot: int, count: int, lanes: Lanes) -> None:
        self.directory = directory
        self.slot = slot
        self.count = count
        self._lanes = lanes

    def beat(self) -> None:
        lanes = self._lanes
        beat = Beat(
            pid=os.getpid(),
            at=time.time(),
            store_open=not lanes.closed,
            store_writable=lanes.writable,
        )
        path = beat_path(self.directory, self.slot)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(beat.model_dump_json())
        os.replace(partial, path)

    def up(self) -> int:
        """How many workers serve with their store open and writable, this one included (its
        own probes say the rest of its readiness)."""
        now = time.time()
        return 1 + sum(
            _up(read_beat(self.directory, slot), now)
            for slot in range(self.count)
            if slot != self.slot
        )


def beat_path(directory: Path, slot: int) -> Path:
    return directory / BEATS_DIR / f"{slot}.json"


def read_beat(directory: Path, slot: int) -> Beat | None:
    try:
        return Beat.model_validate_json(beat_path(directory, slot).read_bytes())
    except (OSError, ValidationError):
        return None


def forget_beat(directory: Path, slot: int) -> None:
    """The parent, once the slot's worker died: no beat stands for it until the next beats."""
    beat_path(directory, slot).unlink(missing_ok=True)


def _up(beat: Beat | None, now: float) -> bool:
    if beat is None or now - beat.at > STALE_SECONDS:
        return False
    return _running(beat.pid) and beat.store_open and beat.store_writable


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: not one of ours
        return False
    return True
