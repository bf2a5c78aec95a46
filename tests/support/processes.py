"""Pausing a process the way a test means it: stopped, every thread of it, before going on.

`kill(pid, SIGSTOP)` returns once the signal is queued. The process stops only when one of
its threads is scheduled to take the signal and stops the others; on a loaded machine its
threads can go on serving for milliseconds meanwhile (a paused OPA answered a decision so).
So a pause waits until every thread of the process is in the stopped state.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

STOP_WAIT_SECONDS = 10.0


def pause(pid: int) -> None:
    """SIGSTOP `pid` and return once every one of its threads has stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while not _all_stopped(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop after SIGSTOP")
        time.sleep(0.001)


def _all_stopped(pid: int) -> bool:
    tasks = Path("/proc") / str(pid) / "task"
    try:
        states = [_state(task / "stat") for task in tasks.iterdir()]
    except FileNotFoundError:
        return True  # gone: nothing of it runs
    return all(state in ("T", "t", "X", "Z", None) for state in states)


def _state(stat: Path) -> str | None:
    """The state letter of /proc/<pid>/task/<tid>/stat (after the parenthesised name)."""
    try:
        text = stat.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None  # the thread ended
    return text[text.rindex(")") + 2]
