"""Local secrets generated once into the data dir (digest key, JWT secret)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SECRETS_DIR = "secrets"


def local_secret(data_dir: Path, name: str, *, nbytes: int = 32) -> bytes:
    """Read the named secret, creating it (mode 0600, exclusive create) on first use."""
    folder = data_dir / SECRETS_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return bytes.fromhex(path.read_text(encoding="ascii").strip())
    value = secrets.token_bytes(nbytes)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(value.hex() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return value
