"""Admissions remembered: a policy set the checks admitted is not checked again.

The same memory serves the tests gate (`service.policy.coverage_gate`): a tree whose
tests passed and covered it is not tested again while every file of it, the coverage it
requires and the OPA binary are the same (`tested_tree_key`).

The admission checks (`service.policy.admission`) take seconds: hundreds of representative
inputs and hundreds of generated ones, each asked of a scratch OPA. Their verdict is a
function of what they are given, so a set admitted once is admitted again as long as all of
it is the same: the bundle's revision (the content hash of every file OPA is served), the
deployment's invariants beside it, the OPA binary, and the code of the checks themselves
(this release's `service/policy` modules). Those, hashed together, name a file in the
user's cache directory (`$XDG_CACHE_HOME/sessionstate/admitted`, else
`~/.cache/sessionstate/admitted`, made owner-only); the file's presence is the memory.

Only an admission is remembered, never a refusal: a refused set is checked afresh every
time, so its message is always today's. Nothing here can admit a set the checks would
refuse unless someone who can write the user's cache directory forges a file there (who
can do that can as well edit the policies the service reads). Remove the directory to
have every set checked again. A cache that cannot be read or written is no cache: the
checks run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

_CHECKS_CODE = Path(__file__).resolve().parent  # the checks and what they sample


def admission_key(revision: str, invariants: Iterable[tuple[str, str]], opa_bin: str) -> str:
    """The hash of everything an admission's verdict depends on."""
    digest = hashlib.sha256(b"sessionstate admission v1\n")
    digest.update(revision.encode() + b"\n")
    for name, rego in invariants:
        digest.update(f"invariant {name} {len(rego)}\n".encode() + rego.encode())
    digest.update(_binary_identity(opa_bin).encode())
    for module in sorted(_CHECKS_CODE.glob("*.py")):
        digest.update(module.name.encode() + b"\n" + module.read_bytes())
    return digest.hexdigest()


def tested_tree_key(root: Path, opa_bin: str, minimum: int) -> str:
    """The hash of everything the tests gate's verdict depends on
    (`service.policy.coverage_gate`): every file of the tree it tests (path and bytes), the
    coverage it requires, the OPA binary and the gate's own code."""
    digest = hashlib.sha256(b"sessionstate policy tests v1\n")
    digest.update(f"minimum {minimum}\n".encode())
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        body = path.read_bytes()
        name = path.relative_to(root).as_posix()
        digest.update(f"file {name} {len(body)}\n".encode() + body)
    digest.update(_binary_identity(opa_bin).encode())
    digest.update((_CHECKS_CODE / "coverage_gate.py").read_bytes())
    return digest.hexdigest()


def remembered(key: str) -> bool:
    try:
        return (_directory() / key).is_file()
    except OSError:
        return False


def remember(key: str) -> None:
    try:
        directory = _directory()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (directory / key).touch(mode=0o600)
    except OSError:
        return  # no cache: the next admission checks again


def _directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sessionstate" / "admitted"


def _binary_identity(opa_bin: str) -> str:
    """The OPA binary as a path, size and modification time: another build is another key."""
    try:
        path = Path(shutil.which(opa_bin) or opa_bin).resolve(strict=True)
        stat = path.stat()
    except OSError:
        return f"opa {opa_bin} unknown\n"
    return f"opa {path} {stat.st_size} {stat.st_mtime_ns}\n"
