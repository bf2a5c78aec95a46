"""The pinned Go tools the decision log's tests run (litewitness, witnessctl, logcheck),
found through scripts/tools.sh as `make tools` built them: a missing one fails the
test that needs it (the script builds it, or says Go is missing), never skips it."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from subprocess import CompletedProcess

from tests.support.paths import ROOT


@cache
def go_tool(name: str) -> Path:
    """The path of the pinned `name` (built on first use, as `make tools` does)."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "tools.sh"), name], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"scripts/tools.sh {name} failed:\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip())


def run_go_tool(name: str, *args: str | Path) -> CompletedProcess[str]:
    """Runs the pinned `name` with `args`, its output captured as text."""
    return subprocess.run(
        [str(go_tool(name)), *map(str, args)], capture_output=True, text=True, timeout=60
    )
