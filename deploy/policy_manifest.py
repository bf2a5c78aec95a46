"""Write or check policies/.manifest, the bundle manifest the container OPA loads.

In docker-compose.yml, OPA loads policies/ itself as a bundle (`--bundle
/policies`). OPA takes the bundle's revision from `policies/.manifest`, so that
file must carry the same content hash that the local sidecar's bundle gets
from `service.policy.bundle` (every non-test `.rego` file and every `data.json`,
the tenant settings). Run this after any policy or tenant settings change;
tests/test_deployment.py fails while the manifest is stale.

    .venv/bin/python deploy/policy_manifest.py          # rewrite policies/.manifest
    .venv/bin/python deploy/policy_manifest.py --check  # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from service.policy.bundle import BUNDLE_ROOTS, load_bundle  # noqa: E402

MANIFEST = ".manifest"


def expected_manifest(policy_dir: Path) -> str:
    """The manifest text for the policy files as they are now."""
    manifest = {"revision": load_bundle(policy_dir).revision, "roots": list(BUNDLE_ROOTS)}
    return json.dumps(manifest, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the manifest is stale")
    parser.add_argument("--policy-dir", type=Path, default=ROOT / "policies")
    args = parser.parse_args(argv)
    path = args.policy_dir / MANIFEST
    wanted = expected_manifest(args.policy_dir)
    current = path.read_text() if path.exists() else None
    if args.check:
        if current != wanted:
            print(
                f"{path} is stale: run .venv/bin/python deploy/policy_manifest.py", file=sys.stderr
            )
            return 1
        return 0
    if current != wanted:
        path.write_text(wanted)
    print(json.loads(wanted)["revision"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
