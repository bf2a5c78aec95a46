"""The data dir held by one serving process: a second one would fight over its files."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path
from typing import TextIO

from service.config.configuration_error import ConfigurationError
from service.policy.reload import LOCK_FILE

LOCK_TRIES = 5  # `policy reload` probes the lock for an instant: do not mistake it for a service


def lock_data_dir(data_dir: Path) -> TextIO:
    """Hold the data dir for this service.

    The lock lives as long as the returned file stays open, and the kernel
    drops it when the process dies, however it dies.
    """
    handle = open(data_dir / LOCK_FILE, "a")  # noqa: SIM115 - held for the process's life
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if attempt + 1 < LOCK_TRIES:
                time.sleep(0.02)
    handle.close()
    raise ConfigurationError(
        f"the data dir {data_dir} is in use by another sessionstate process"
    ) from None
