"""The loopback port an OPA sidecar listens on, chosen where nothing else takes one.

A port found free by binding to port 0 comes from the kernel's ephemeral range
(`net.ipv4.ip_local_port_range`), the same range every outgoing connection and
every other bind to port 0 on the host draws from: between the choice and OPA's
own bind, another process may be given it, and OPA then cannot listen. So the
port is drawn at random from just below that range, where the kernel never
assigns one by itself, and taken only if a bind to it succeeds now.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 12_000  # how many ports below the ephemeral range are drawn from
_LOWEST = 1024
_DRAWS = 64


def sidecar_port() -> int:
    """A loopback port free now, outside the ephemeral range where the host allows it."""
    low = _ephemeral_low()
    if low - _LOWEST >= _SPAN // 4:
        first = max(_LOWEST, low - _SPAN)
        for _ in range(_DRAWS):
            port = first + secrets.randbelow(low - first)
            if _bindable(port):
                return port
    return _any_free_port()


def _ephemeral_low() -> int:
    try:
        return int(_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere this is only a guess


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _any_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
