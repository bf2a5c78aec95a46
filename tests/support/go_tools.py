"""The pinned Go tools the decision log's tests run (litewitness, witnessctl, logcheck),
found through scripts/tools.sh as `make tools` built them: a missing one fails the
test that needs it (the script builds it, or says Go is missing), never skips it."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

from tests.support.paths import ROOT


@cache
def go_tool(name: str) -> Path:
    """The path of the pinned `name` (built on first use, as `make tools` does)."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "tools.sh"), name], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"scripts/tools.sh {name} failed:\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip())
