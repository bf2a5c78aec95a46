"""The policy set as an OPA bundle whose revision is a content hash of its files.

The revision names exactly the Rego and data OPA evaluates: the same in every
decision trace until a policy file or a data document (the tenant settings,
`service.policy.tenant_settings`) changes, and different as soon as one does.
Beside the policy set's files, every bundle written, served or signed carries the
service's own `sessionstate.batch` module (`service.policy.batch`), which decides
each input of a grouped query by the set's own packages and nothing else; it is
fixed by the service's version, so the revision, a hash of the set's files,
leaves it out.

A policy directory's own `.manifest` (`make policy-manifest`) may name the commit its
files came from (`metadata.commit`, `git describe --always --dirty` where it was
written); the bundle carries it on only while that manifest's revision is the files'
own, so a stale manifest names no commit.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from service.policy.batch import LIVE_BATCH_MODULE_PATH, live_batch_module
from store.canonical import canonical_digest

BUNDLE_ROOTS = ("sessionstate", "system")
INVARIANTS_DIR = "invariants"  # the deployment's invariants: checked, never served
METADATA_KEY = "sessionstate"  # the manifest's `metadata` member that is ours: {"serial": N}
MAX_COMMIT = 128  # `git describe` of a tag, distance, hash and `-dirty` fits well


class ServedBundle(Protocol):
    """What the bundle server hands OPA: a revision, an ETag and the tarball."""

    @property
    def revision(self) -> str: ...

    @property
    def etag(self) -> str: ...

    def tarball(self) -> bytes: ...

    @property
    def commit(self) -> str | None:
        """The commit its manifest names (`metadata.commit`); None when it names none."""
        ...


@dataclass(frozen=True)
class PolicyBundle:
    """The policy files of a directory as a bundle: revision plus tarball."""

    revision: str
    files: tuple[tuple[str, bytes], ...]
    commit: str | None = None

    @property
    def etag(self) -> str:
        return self.revision

    def manifest(self, serial: int | None = None) -> bytes:
        """The bundle's `.manifest`: its revision and roots, the commit its files came from
        (if known), and a signed bundle's serial (`service.policy.rollback`)."""
        manifest: dict[str, object] = {"revision": self.revision, "roots": list(BUNDLE_ROOTS)}
        metadata: dict[str, object] = {}
        if self.commit is not None:
            metadata["commit"] = self.commit
        if serial is not None:
            metadata[METADATA_KEY] = {"serial": serial}
        if metadata:
            manifest["metadata"] = metadata
        return json.dumps(manifest).encode()

    @property
    def served_files(self) -> tuple[tuple[str, bytes], ...]:
        """What OPA is given: the set's files and the service's batch module (once: a signed
        bundle's files carry it already)."""
        if any(name == LIVE_BATCH_MODULE_PATH for name, _ in self.files):
            return self.files
        return (*self.files, (LIVE_BATCH_MODULE_PATH, live_batch_module()))

    def write_to(self, root: Path, *, serial: int | None = None, served: bool = True) -> None:
        """The bundle as a directory under root: `.manifest` and the files OPA is given (for
        `opa check` and `opa build`), or the set's own files alone (`served` false: what its
        tests must cover)."""
        (root / ".manifest").write_bytes(self.manifest(serial))
        for name, content in self.served_files if served else self.files:
            path = root / name.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)

    def tarball(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for name, content in (("/.manifest", self.manifest()), *self.served_files):
                info = tarfile.TarInfo(name)
                info.size = len(content)
                info.mode = 0o444
                archive.addfile(info, io.BytesIO(content))
        return buffer.getvalue()


def policy_files(policy_dir: Path) -> tuple[tuple[str, bytes], ...]:
    """The files OPA serves decisions from, sorted: every `.rego` but the tests and the
    invariants (`invariants/`, `service.policy.invariants`), and every `data.json` under the
    bundle's roots (what OPA itself loads from a bundle directory)."""
    rego = (
        path
        for path in policy_dir.rglob("*.rego")
        if path.is_file()
        and not path.name.endswith("_test.rego")
        and not is_invariant(path, policy_dir)
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


def is_invariant(path: Path, policy_dir: Path) -> bool:
    """True for a file of the directory's invariants (or their tests): never served."""
    return path.relative_to(policy_dir).parts[0] == INVARIANTS_DIR


def load_bundle(policy_dir: Path) -> PolicyBundle:
    files = policy_files(policy_dir)
    revision = policy_revision(files)
    return PolicyBundle(
        revision=revision, files=files, commit=_manifest_commit(policy_dir, revision)
    )


def manifest_commit(manifest: object) -> str | None:
    """The commit a parsed `.manifest` names (`metadata.commit`), if it is a short string."""
    metadata = manifest.get("metadata") if isinstance(manifest, dict) else None
    commit = metadata.get("commit") if isinstance(metadata, dict) else None
    return commit if isinstance(commit, str) and 0 < len(commit) <= MAX_COMMIT else None


def _manifest_commit(policy_dir: Path, revision: str) -> str | None:
    """The commit the directory's `.manifest` names, if that manifest is of these files."""
    try:
        manifest = json.loads((policy_dir / ".manifest").read_bytes()[:65_536])
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("revision") != revision:
        return None
    return manifest_commit(manifest)


def policy_revision(files: tuple[tuple[str, bytes], ...]) -> str:
    """`sha256:` over the sorted (path, sha256 of content) pairs of the policy set."""
    listing = [[name, hashlib.sha256(content).hexdigest()] for name, content in files]
    return canonical_digest(listing)
