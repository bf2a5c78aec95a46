"""The policy set as an OPA bundle whose revision is a content hash of its files.

The revision names exactly the Rego and data OPA evaluates: the same in every
decision trace until a policy file or a data document (the tenant settings,
`service.policy.tenant_settings`) changes, and different as soon as one does.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from store.canonical import canonical_digest

BUNDLE_ROOTS = ("sessionstate", "system")
METADATA_KEY = "sessionstate"  # the manifest's `metadata` member that is ours: {"serial": N}


class ServedBundle(Protocol):
    """What the bundle server hands OPA: a revision, an ETag and the tarball."""

    @property
    def revision(self) -> str: ...

    @property
    def etag(self) -> str: ...

    def tarball(self) -> bytes: ...


@dataclass(frozen=True)
class PolicyBundle:
    """The policy files of a directory as a bundle: revision plus tarball."""

    revision: str
    files: tuple[tuple[str, bytes], ...]

    @property
    def etag(self) -> str:
        return self.revision

    def manifest(self, serial: int | None = None) -> bytes:
        """The bundle's `.manifest`: its revision and roots, and a signed bundle's serial
        (`service.policy.rollback`)."""
        manifest: dict[str, object] = {"revision": self.revision, "roots": list(BUNDLE_ROOTS)}
        if serial is not None:
            manifest["metadata"] = {METADATA_KEY: {"serial": serial}}
        return json.dumps(manifest).encode()

    def write_to(self, root: Path, *, serial: int | None = None) -> None:
        """The bundle as a directory under root: `.manifest` and its files (for `opa check`
        and `opa build`)."""
        (root / ".manifest").write_bytes(self.manifest(serial))
        for name, content in self.files:
            path = root / name.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)

    def tarball(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for name, content in (("/.manifest", self.manifest()), *self.files):
                info = tarfile.TarInfo(name)
                info.size = len(content)
                info.mode = 0o444
                archive.addfile(info, io.BytesIO(content))
        return buffer.getvalue()


def policy_files(policy_dir: Path) -> tuple[tuple[str, bytes], ...]:
    """The files OPA serves decisions from, sorted: every `.rego` but the tests, and every
    `data.json` under the bundle's roots (what OPA itself loads from a bundle directory)."""
    rego = (
        path
        for path in policy_dir.rglob("*.rego")
        if path.is_file() and not path.name.endswith("_test.rego")
    )
    data = (
        path
        for root in BUNDLE_ROOTS
        for path in (policy_dir / root).rglob("data.json")
        if path.is_file()
    )
    found = sorted((*rego, *data))
    return tuple(
        ("/" + path.relative_to(policy_dir).as_posix(), path.read_bytes()) for path in found
    )


def load_bundle(policy_dir: Path) -> PolicyBundle:
    files = policy_files(policy_dir)
    return PolicyBundle(revision=policy_revision(files), files=files)


def policy_revision(files: tuple[tuple[str, bytes], ...]) -> str:
    """`sha256:` over the sorted (path, sha256 of content) pairs of the policy set."""
    listing = [[name, hashlib.sha256(content).hexdigest()] for name, content in files]
    return canonical_digest(listing)
