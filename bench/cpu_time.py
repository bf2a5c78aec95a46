"""The CPU time processes spend while a bench measures them, read from /proc.

A figure of ops/s says how fast; the CPU each operation costs says what that
speed is bought with, on a machine whose cores the load generator, the
service, its OPA sidecar and the database share. `ProcessTree` follows a
process and every descendant it has at each reading (the service and its OPA
sidecar, or its workers; PostgreSQL's postmaster and its backends), summing
user and system time (utime + stime of /proc/PID/stat, every thread
included). Between two readings a process that exists at both counts its
difference, one that appeared counts whole, and one that exited in between is
lost (its last CPU is not counted, so a figure is a lower bound when
processes come and go).

    tree = ProcessTree(pid)
    before = tree.reading()
    ...  # the load
    seconds = tree.reading().since(before)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")  # /proc/PID/stat counts CPU in these


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3 on), or None when gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()


def parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def command_name(pid: int) -> str | None:
    """The process's command name (/proc/PID/comm), or None when it is gone."""
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds the process has used so far, or None when it is gone."""
    fields = _stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15)


def descendants(root: int) -> list[int]:
    """root and every process below it, as /proc shows them now."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, waiting = [], [root]
    while waiting:
        pid = waiting.pop()
        found.append(pid)
        waiting.extend(children.get(pid, []))
    return found


@dataclass(frozen=True)
class Reading:
    """CPU seconds of each process of a tree at one moment."""

    seconds: dict[int, float]

    def since(self, earlier: Reading) -> float:
        """CPU seconds the tree spent since earlier (see the module's note on exits)."""
        return sum(now - earlier.seconds.get(pid, 0.0) for pid, now in self.seconds.items())


class ProcessTree:
    """A process and its descendants, read at each `reading()`."""

    def __init__(self, root: int) -> None:
        self.root = root

    def reading(self) -> Reading:
        found = {pid: cpu_seconds(pid) for pid in descendants(self.root)}
        return Reading({pid: seconds for pid, seconds in found.items() if seconds is not None})
