"""A free loopback port for a server a test starts, drawn as the OPA sidecar's is
(`service.policy.sidecar_port`): outside the kernel's ephemeral range, so no other
test's connection can be given it before the server binds it."""

from __future__ import annotations

from service.policy.sidecar_port import sidecar_port


def free_port() -> int:
    return sidecar_port()
