"""The private directory the local OPA sidecar's Unix socket lives in.

The sidecar the service starts itself listens on a Unix domain socket instead
of loopback TCP, without OPA's token authentication and `system.authz`: what
keeps every other local user out is the file system. The socket sits in a
directory of the service's user with mode 0700 (nobody else may even reach
the socket's name), and OPA makes the socket itself 0600
(`--unix-socket-perm`). Any other user's `connect()` fails with EACCES before
OPA sees a byte. On loopback TCP any local user can connect, so there the
token and authz are what refuses them, at about twice OPA's CPU per decision
(docs/performance.md, "OPA's lock-down, measured").

A directory that exists but is not the service user's own, is a symbolic link
or is open to group or others is never used: it is not ours to make private,
and somebody may be waiting in it. The start stops with one line saying which.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from service.policy.transport import MAX_SOCKET_PATH

SOCKET_DIR_MODE = 0o700
SOCKET_PERM = "600"  # OPA's --unix-socket-perm


class SocketDirError(RuntimeError):
    """The socket's directory cannot be made private, or the socket's path is too long."""


def private_socket(directory: Path, name: str = "opa.sock") -> Path:
    """The socket's path in `directory`, made (0700) if missing, checked private if not;
    a socket left there by an earlier OPA is removed, so that a new one can listen."""
    path = fitting(directory / name)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=SOCKET_DIR_MODE)
    found = os.lstat(directory)
    why = _not_private(found)
    if why is not None:
        raise SocketDirError(
            f"the OPA sidecar's socket directory {directory} {why}; it must be a directory "
            f"of uid {os.geteuid()} with mode 0700 (remove it and the service makes it)"
        )
    try:
        left = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISSOCK(left.st_mode):
        raise SocketDirError(f"{path} is there and is no socket; remove it")
    path.unlink()
    return path


def fitting(path: Path) -> Path:
    """path, if a Unix socket can have it (AF_UNIX holds at most 107 bytes of it)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SocketDirError(
            f"the OPA sidecar's socket path {path} is longer than a Unix socket's "
            f"{MAX_SOCKET_PATH} bytes; use a shorter SESSIONSTATE_DATA_DIR"
        )
    return path


def _not_private(found: os.stat_result) -> str | None:
    if stat.S_ISLNK(found.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(found.st_mode):
        return "is not a directory"
    if found.st_uid != os.geteuid():
        return f"belongs to uid {found.st_uid}"
    if stat.S_IMODE(found.st_mode) != SOCKET_DIR_MODE:
        return f"has mode {stat.S_IMODE(found.st_mode):04o}"
    return None
