"""The CPU a bench's server processes spend, from /proc, split into the service's and OPA's.

A figure's CPU per request is what its server processes spent between two
samples taken around the measured load, divided by the requests the load
counted. `sample(roots)` reads `/proc/PID/stat` (utime + stime: every thread of
the process, live or ended) of each root and of every process below it (the
service's workers, its OPA sidecar), and files each under `"opa"` when its
command name is OPA's, else under `"service"`. `per_request` turns two samples
into milliseconds of CPU per request for each, and their total.

What it does not see: a process that ended between the two samples (its CPU is
lost, nor is it in the parent's cutime until reaped), the load generator's own
CPU, and the kernel's work on behalf of no process (softirqs of loopback
traffic are charged to whichever process happens to run). Linux only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
OPA_COMMAND = "opa"  # /proc/PID/comm of the OPA binary
ROLES = ("service", "opa")


@dataclass(frozen=True)
class Stat:
    """One process's fields of /proc/PID/stat that a sample needs."""

    pid: int
    command: str
    parent: int
    started: int  # ticks after boot: tells a reused pid from the process sampled before
    cpu_seconds: float  # utime + stime


def read_stat(pid: int) -> Stat | None:
    """The process's stat, or None when it is gone (or unreadable)."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")".
    head, _, rest = raw.rpartition(")")
    fields = rest.split()
    # fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15, starttime 22.
    return Stat(
        pid=pid,
        command=head.partition("(")[2],
        parent=int(fields[1]),
        started=int(fields[19]),
        cpu_seconds=(int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND,
    )


def every_stat() -> dict[int, Stat]:
    """Every process visible in /proc, by pid."""
    found = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := read_stat(int(entry.name))) is not None:
            found[stat.pid] = stat
    return found


def tree(roots: Iterable[int], stats: dict[int, Stat]) -> list[Stat]:
    """Each root that is alive and every process below it, each once."""
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.parent, []).append(stat.pid)
    seen: set[int] = set()
    pending = [pid for pid in roots if pid in stats]
    while pending:
        pid = pending.pop()
        if pid not in seen:
            seen.add(pid)
            pending.extend(children.get(pid, ()))
    return [stats[pid] for pid in sorted(seen)]


@dataclass(frozen=True)
class Sample:
    """The processes of a tree at one moment: (pid, start time) -> (role, CPU seconds)."""

    processes: dict[tuple[int, int], tuple[str, float]]


def role_of(stat: Stat) -> str:
    return "opa" if stat.command == OPA_COMMAND else "service"


def sample(roots: Iterable[int]) -> Sample:
    """The CPU so far of the roots and every process below them, each filed by role."""
    return Sample(
        {
            (stat.pid, stat.started): (role_of(stat), stat.cpu_seconds)
            for stat in tree(roots, every_stat())
        }
    )


def spent(before: Sample, after: Sample) -> dict[str, float]:
    """CPU seconds each role present in `after` spent since `before` (a process started in
    between counts whole)."""
    found: dict[str, float] = {}
    for key, (role, seconds) in after.processes.items():
        earlier = before.processes.get(key, (role, 0.0))[1]
        found[role] = found.get(role, 0.0) + seconds - earlier
    return found


def per_request(before: Sample, after: Sample, requests: int) -> dict[str, float | None]:
    """Milliseconds of CPU per request of the service's processes, of OPA's, and in total;
    None for a role with no process (e.g. no OPA behind hello-world)."""
    used = spent(before, after)
    count = max(requests, 1)
    found: dict[str, float | None] = {
        role: round(used[role] * 1000 / count, 3) if role in used else None for role in ROLES
    }
    found["total"] = round(sum(used.values()) * 1000 / count, 3) if used else None
    return found
