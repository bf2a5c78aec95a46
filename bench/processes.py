"""The processes a bench starts (services, sidecars, floors, wrk) are stopped however it ends.

`exit_on_sigterm()` turns SIGTERM (and Ctrl-C) into `SystemExit`, so every
`finally` and `with` block on the way out runs and stops what it started.
`held_signals()` puts such an exit off until a process just started has been
recorded by its owner. `stop_group` stops a process started in a session of
its own: SIGTERM, then SIGKILL to its whole group if it lingers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_held = {"holding": False, "pending": 0}


def exit_on_sigterm() -> None:
    """SIGTERM and SIGINT end the bench with every `finally` run; within `held_signals`
    the exit waits until the block is done."""

    def stop(signum: int, _frame: object) -> None:
        if _held["holding"]:
            _held["pending"] = signum
        else:
            sys.exit(128 + signum)

    for signum in _STOP_SIGNALS:
        signal.signal(signum, stop)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """A stop asked for in the block ends the bench only once the block is done, so a
    process started in it is recorded (to be stopped) first. Not a signal mask: a child
    started under one inherits it, and would then ignore SIGTERM."""
    _held["holding"] = True
    try:
        yield
    finally:
        _held["holding"] = False
        if _held["pending"]:
            sys.exit(128 + int(_held["pending"]))


def stop_group(
    process: subprocess.Popen[bytes], timeout: float, what: str = "process"
) -> int | None:
    """SIGTERM, wait up to timeout; then SIGKILL its process group. Its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            print(
                f"{what} still running {timeout:.0f}s after SIGTERM: killing its group",
                file=sys.stderr,
            )
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.wait()
