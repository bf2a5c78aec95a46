"""docs/compliance.md's hash recipe, as a reviewer runs it: the Python program of the doc's
recipe itself (rfc8785 over the entry without `hash`), read from the doc, with the entry on
its standard input, nothing of the service's own code."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Mapping
from contextlib import redirect_stdout
from typing import Any

from tests.support.paths import ROOT

DOC = ROOT / "docs" / "compliance.md"
# The recipe's program: `python -c '...' < entry.json`, in the fenced block that hashes.
PROGRAM = re.compile(r"python -c '\n(?P<program>[^']*rfc8785\.dumps[^']*)' < entry\.json")


def _recipe() -> Any:
    found = PROGRAM.search(DOC.read_text())
    assert found is not None, "docs/compliance.md has no hash recipe"
    return compile(found["program"], f"{DOC.name} (hash recipe)", "exec")


RECIPE = _recipe()


def hashes_as_the_recipe_says(entry: Mapping[str, Any]) -> bool:
    """Whether the doc's recipe prints True for the entry, as an answer returned it."""
    printed, stdin = io.StringIO(), sys.stdin
    sys.stdin = io.StringIO(json.dumps(entry))
    try:
        with redirect_stdout(printed):
            exec(RECIPE, {"__name__": "__main__"})
    finally:
        sys.stdin = stdin
    assert printed.getvalue() in ("True\n", "False\n")
    return printed.getvalue() == "True\n"
