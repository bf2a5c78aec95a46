"""Write or check policies/.manifest, the bundle manifest the container OPA loads.

In docker-compose.yml, OPA loads policies/ itself as a bundle (`--bundle
/policies`). OPA takes the bundle's revision from `policies/.manifest`, so that
file must carry the same content hash that the local sidecar's bundle gets
from `service.policy.bundle` (every non-test `.rego` file and every `data.json`,
the tenant settings). Run this after any policy or tenant settings change;
tests/runtime/test_deployment.py fails while the manifest is stale.

With `--commit` (as `make policy-manifest` runs it) in a git checkout, it also
records the commit the files came from (`metadata.commit`: `git describe
--always`, and `-dirty` when the policy directory had changes other than its
manifest); the service names it in each activation of that revision on the decision log. Without it, a
manifest that names the same files is left as it is (with the commit it names).
`--check` compares the revision and roots only: a manifest written at another
commit is not stale while it names the same files.

    .venv/bin/python deploy/policy_manifest.py          # rewrite policies/.manifest
    .venv/bin/python deploy/policy_manifest.py --check  # exit 1 if it is stale
    .venv/bin/python deploy/policy_manifest.py --commit # and name the checkout's commit
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from service.policy.bundle import BUNDLE_ROOTS, MAX_COMMIT, load_bundle  # noqa: E402

MANIFEST = ".manifest"


def expected_manifest(policy_dir: Path, commit: str | None = None) -> str:
    """The manifest text for the policy files as they are now (naming `commit`, if given)."""
    manifest: dict[str, object] = {
        "revision": load_bundle(policy_dir).revision,
        "roots": list(BUNDLE_ROOTS),
    }
    if commit is not None:
        manifest["metadata"] = {"commit": commit}
    return json.dumps(manifest, indent=2) + "\n"


def described_commit(policy_dir: Path) -> str | None:
    """`git describe --always` of the checkout holding policy_dir, with `-dirty` when the
    work tree has changes other than the manifest itself (which this tool writes); None
    outside a checkout (or without git)."""
    described = _git(policy_dir, "describe", "--always")
    changed = _git(
        policy_dir,
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":(exclude).manifest",
    )
    if described is None or changed is None or not 0 < len(described) <= MAX_COMMIT - 6:
        return None
    return described + ("-dirty" if changed else "")


def _git(policy_dir: Path, *args: str) -> str | None:
    """What git prints for `args` run in policy_dir, stripped; None when it fails."""
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            ["git", "-C", str(policy_dir), *args],  # noqa: S607
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def is_stale(policy_dir: Path, text: str | None) -> bool:
    """Whether a manifest's text names other files than the directory's (its revision and
    roots; the commit it names is not compared)."""
    return _files_named(text) != _files_named(expected_manifest(policy_dir))


def _files_named(text: str | None) -> object:
    try:
        manifest = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(manifest, dict):
        return None
    return manifest.get("revision"), manifest.get("roots")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the manifest is stale")
    parser.add_argument(
        "--commit",
        action="store_true",
        help="record `git describe --always --dirty` of the checkout as metadata.commit",
    )
    parser.add_argument("--policy-dir", type=Path, default=ROOT / "policies")
    args = parser.parse_args(argv)
    path = args.policy_dir / MANIFEST
    current = path.read_text() if path.exists() else None
    if args.check:
        if is_stale(args.policy_dir, current):
            print(
                f"{path} is stale: run .venv/bin/python deploy/policy_manifest.py", file=sys.stderr
            )
            return 1
        return 0
    wanted = expected_manifest(
        args.policy_dir, described_commit(args.policy_dir) if args.commit else None
    )
    if current != wanted and (args.commit or is_stale(args.policy_dir, current)):
        path.write_text(wanted)
    print(json.loads(wanted)["revision"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
