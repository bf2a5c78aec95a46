"""Fail unless `opa test --coverage --format json` (on stdin) covers every policy file fully.

The figures are the ones `sessionstate policy build` and a policy reload judge
(`service.policy.coverage_gate`); `policies/` itself must stay at 100%.
"""

from __future__ import annotations

import json
import sys

from service.policy.coverage_gate import DEFAULT_COVERAGE_MIN, file_coverage, shortfalls


def main() -> int:
    coverage = file_coverage(json.load(sys.stdin))
    for name, percent in sorted(coverage.items()):
        print(f"{percent:6.1f}%  {name}")
    if not coverage:
        print("no policy files were covered", file=sys.stderr)
        return 1
    missing = shortfalls(coverage, DEFAULT_COVERAGE_MIN)
    if missing:
        print(
            f"policy coverage below {DEFAULT_COVERAGE_MIN}% in {len(missing)} file(s)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
