"""Secrets as text: generated once into the data dir, provisioned once for a whole
deployment (`SecretsHome`), or given in the environment.

One format for both places. A secret written as `hex:` and hexadecimal digits
is the bytes those digits spell; that is how the data dir stores a generated
secret and how `sessionstate secrets export` prints one, so a secret moves
between a data dir file and an environment variable unchanged. In the
environment, text without the prefix is its own UTF-8 bytes (a passphrase set
by hand, as deployments always could). A data dir file without the prefix was
written before the prefix existed: it holds bare hexadecimal, read as before.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SECRETS_DIR = "secrets"
HEX_PREFIX = "hex:"


def encode_secret(value: bytes) -> str:
    """The text form of a secret's bytes: `hex:` and their hexadecimal digits."""
    return HEX_PREFIX + value.hex()


def decode_secret(text: str) -> bytes:
    """The bytes of a secret given as text: `hex:…` spells them, other text is UTF-8.

    Raises ValueError (whose message holds no part of the text) when `hex:` is
    followed by something that is not hexadecimal.
    """
    if text.startswith(HEX_PREFIX):
        try:
            return bytes.fromhex(text[len(HEX_PREFIX) :])
        except ValueError:
            raise ValueError(
                f"starts with {HEX_PREFIX} but the rest is not an even number of hex digits"
            ) from None
    return text.encode()


def local_secret(data_dir: Path, name: str, *, nbytes: int = 32) -> bytes:
    """Read the data dir's named secret, creating it on first use (mode 0600, whole)."""
    return SecretsHome.local(data_dir).secret(name, nbytes=nbytes)


def stored_secret(data_dir: Path, name: str) -> bytes | None:
    """The named secret if the data dir holds it; never creates one."""
    return SecretsHome.local(data_dir).stored(name)


class SecretMissing(Exception):
    """A provisioned secrets folder lacks a file (or cannot be read): named, never shown."""

    def __init__(self, name: str) -> None:
        super().__init__(f"holds no readable {name}")
        self.name = name


@dataclass(frozen=True)
class SecretsHome:
    """Where a deployment's secrets are: the folder an operator provisioned once for every
    replica (`provisioned`: read, never written into; a missing file is `SecretMissing`),
    or a data dir's own `secrets/`, where each is generated on first use (`local`)."""

    folder: Path
    provisioned: bool

    @classmethod
    def local(cls, data_dir: Path) -> SecretsHome:
        return cls(data_dir / SECRETS_DIR, provisioned=False)

    @classmethod
    def provisioned_at(cls, folder: Path) -> SecretsHome:
        return cls(folder, provisioned=True)

    def secret(self, name: str, *, nbytes: int = 32) -> bytes:
        """The named secret's bytes; generated on first use in a data dir."""
        return _decode(
            self.key_file(
                name, lambda: (encode_secret(secrets.token_bytes(nbytes)) + "\n").encode("ascii")
            ).decode("ascii")
        )

    def key_file(self, name: str, make: Callable[[], bytes]) -> bytes:
        """The named file's bytes (a PEM private key, a secret's text); in a data dir made by
        `make` on first use (`local_key_file`)."""
        if not self.provisioned:
            return local_key_file(self.folder, name, make)
        try:
            return (self.folder / name).read_bytes()
        except OSError:
            raise SecretMissing(name) from None

    def holds(self, name: str) -> bool:
        return (self.folder / name).exists()

    def stored(self, name: str) -> bytes | None:
        """The named secret if the folder holds it; never creates one."""
        try:
            return _read(self.folder / name)
        except FileNotFoundError:
            return None


def _read(path: Path) -> bytes:
    return _decode(path.read_text(encoding="ascii"))


def _decode(stored: str) -> bytes:
    """A secrets file's text: `hex:…`, or bare hex as written before the prefix; both hex."""
    return bytes.fromhex(stored.strip().removeprefix(HEX_PREFIX))


def local_key_file(folder: Path, name: str, make: Callable[[], bytes]) -> bytes:
    """The named file's bytes in `folder` (a data dir's, made mode 0700), made by `make` on
    first use.

    Written whole to a temporary file and linked into place (mode 0600): processes
    that start together on one data dir (`serve --workers N`) all read the one key
    the first link made, never a half-written one.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / name
    if path.exists():
        return path.read_bytes()
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(make())
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first: its key
            os.link(temporary, path)
    finally:
        os.unlink(temporary)
    return path.read_bytes()
