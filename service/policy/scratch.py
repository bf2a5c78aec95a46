"""A scratch `opa eval` of a candidate policy set: one process, one query, one input document.

What the admission checks ask a set before it is served (`service.policy.admission`). The
candidate is loaded as the bundle the sidecar would serve (`--bundle`, its `.manifest` and
roots), with modules of the check's own beside it (`--data`: the batch query, invariants).
The process gets none of the service's `SESSIONSTATE_*` variables (as the sidecar's OPA
does not), so a candidate's `opa.runtime()` sees no secret, and it reaches no host: its
capabilities are OPA's own with an empty `allow_net`, so `http.send` and
`net.lookup_ip_addr` fail. A candidate is evaluated here before anything else has
vouched for it (a signed bundle's signature is OPA's to check when it activates it).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from service.policy.opa_errors import check_errors

TIMEOUT_SECONDS = 60


@cache
def offline_capabilities(opa_bin: str) -> str:
    """This OPA's capabilities (`opa capabilities --current`) with no host allowed."""
    try:
        ran = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [opa_bin, "capabilities", "--current"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=True,
        )
        capabilities = json.loads(ran.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        raise EvaluationFailed("`opa capabilities` could not run (SESSIONSTATE_OPA_BIN)") from None
    return json.dumps({**capabilities, "allow_net": []})


class EvaluationFailed(RuntimeError):
    """OPA could not evaluate the query: `str()` says why (OPA's error codes and messages)."""


def evaluate(
    opa_bin: str,
    bundle_root: Path,
    query: str,
    document: Mapping[str, Any],
    modules: Sequence[tuple[str, str]] = (),
) -> Any:
    """The query's value over the bundle and `modules` ((file name, Rego) pairs) for `input`
    `document`; None when it is undefined."""
    with tempfile.TemporaryDirectory(prefix="sessionstate-policy-eval-") as tmp:
        scratch = Path(tmp)
        (scratch / "input.json").write_text(json.dumps(document, separators=(",", ":")))
        (scratch / "capabilities.json").write_text(offline_capabilities(opa_bin))
        extra: list[str] = []
        for name, text in modules:
            (scratch / name).write_text(text)
            extra += ["--data", str(scratch / name)]
        env = {
            key: value for key, value in os.environ.items() if not key.startswith("SESSIONSTATE_")
        }
        try:
            ran = subprocess.run(  # noqa: S603 - fixed argv, no shell
                [
                    opa_bin,
                    "eval",
                    "--format",
                    "json",
                    "--capabilities",
                    str(scratch / "capabilities.json"),
                    "--bundle",
                    str(bundle_root),
                    *extra,
                    "--input",
                    str(scratch / "input.json"),
                    query,
                ],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_SECONDS,
                check=False,
                env=env,
            )
        except (OSError, subprocess.TimeoutExpired):
            raise EvaluationFailed("`opa eval` could not run (SESSIONSTATE_OPA_BIN)") from None
    if ran.returncode != 0:
        errors = check_errors(
            ran.stdout + ran.stderr, f"{bundle_root}/", fallback="`opa eval` failed"
        )
        raise EvaluationFailed("; ".join(errors))
    try:
        results = json.loads(ran.stdout).get("result") or []
        return results[0]["expressions"][0]["value"] if results else None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise EvaluationFailed("`opa eval` answered something unreadable") from None
