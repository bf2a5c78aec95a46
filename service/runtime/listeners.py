"""The listening sockets, bound before anything starts so that a taken port is a clear error
rather than a half-started service: one, or for `--workers N` one per worker."""

from __future__ import annotations

import socket

from service.config.configuration_error import ConfigurationError

BACKLOG = 1024  # connections the kernel holds for each listening socket until it is accepted


def listen(host: str, port: int) -> socket.socket:
    """One socket listening on host:port; a port that cannot be bound is a `ConfigurationError`."""
    try:
        return socket.create_server((host, port), backlog=BACKLOG, reuse_port=False)
    except OSError as error:
        raise _cannot_listen(host, port, error) from None


def listeners(host: str, port: int, workers: int) -> list[socket.socket]:
    """One listening socket, or for `--workers N` one per worker (`service.runtime.workers`).
    The port is bound alone first, so one that another service holds, even with SO_REUSEPORT,
    is a clear error rather than clients shared with it."""
    listener = listen(host, port)
    if workers == 1:
        return [listener]
    try:
        return listeners_per_worker(listener, workers)
    except OSError as error:
        raise _cannot_listen(host, port, error) from None


def listeners_per_worker(listener: socket.socket, count: int) -> list[socket.socket]:
    """count sockets listening with SO_REUSEPORT on listener's address (one per worker), in
    place of listener, which is closed. The kernel lets only processes of the same user
    join such a group of sockets."""
    host, port = listener.getsockname()[:2]
    listener.close()
    made: list[socket.socket] = []
    try:
        for _ in range(count):
            made.append(socket.create_server((host, port), backlog=BACKLOG, reuse_port=True))
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made


def _cannot_listen(host: str, port: int, error: OSError) -> ConfigurationError:
    return ConfigurationError(
        f"cannot listen on {host}:{port} (SESSIONSTATE_HOST/SESSIONSTATE_PORT): "
        f"{error.strerror or 'address unavailable'}"
    )
