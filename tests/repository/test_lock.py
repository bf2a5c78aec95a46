"""The dependency lock matches pyproject.toml: what `make test`'s lock-check runs, offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT


def test_the_lock_and_its_exports_match_pyproject() -> None:
    uv = Path(sys.executable).parent / "uv"
    done = subprocess.run(
        [ROOT / "scripts" / "lock.sh", "check"],
        env={**os.environ, "UV": str(uv)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_every_locked_requirement_is_pinned_and_hashed() -> None:
    for name in ("runtime.txt", "dev.txt"):
        text = (ROOT / "requirements" / name).read_text()
        pins = [line for line in text.splitlines() if line and not line[0].isspace()]
        assert pins and all("==" in pin for pin in pins), name
        assert text.count("--hash=sha256:") >= len(pins), name
