"""Fail unless `opa test --coverage --format json` (on stdin) covers every policy file fully."""

from __future__ import annotations

import json
import sys


def main() -> int:
    report = json.load(sys.stdin)
    short = {
        name: data.get("coverage", 0)
        for name, data in report.get("files", {}).items()
        if not name.endswith("_test.rego")
    }
    for name, coverage in sorted(short.items()):
        print(f"{coverage:6.1f}%  {name}")
    missing = {name: c for name, c in short.items() if c < 100}
    if not short:
        print("no policy files were covered", file=sys.stderr)
        return 1
    if missing:
        print(f"policy coverage below 100% in {len(missing)} file(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
