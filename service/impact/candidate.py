"""The candidate policy set: checked as `make test` checks policies, then served for the run.

The check is `opa check --strict` against the input schema (the candidate's own
`schemas/` when it has one, else the live policy directory's), so a candidate
that would not pass `make test` is refused before anything is evaluated. The
candidate is then served by an `OpaSidecar` of its own, on a scratch work dir,
with the service's lock-down (token authentication, `system.authz`, a bundle
from a loopback bundle server), and asked over several keep-alive connections
at once: one HTTP round trip per decision, as the service asks.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.impact.compare import LoggedDecision
from service.impact.report import Verdict
from service.policy.client import bundle_revision
from service.policy.sidecar import OpaSidecar
from service.policy.source import PolicySourceError
from service.policy.transport import KeepAliveTransport
from service.reasons import Reason

CONNECTIONS = 4  # concurrent queries: OPA evaluates them on every core it has
QUERY_TIMEOUT_SECONDS = 30.0
MAX_ERRORS = 5


class CandidateBroken(ValueError):
    """The candidate does not compile or cannot be served: no report."""


class CandidateUnavailable(RuntimeError):
    """The candidate's OPA stopped answering during the run: no report."""


def check(opa_bin: str, candidate: Path, live_policy_dir: Path) -> None:
    """`opa check --strict --schema SCHEMAS CANDIDATE`, as `make lint-rego` runs it."""
    if not candidate.is_dir():
        raise CandidateBroken(f"the candidate {candidate} is not a directory")
    schemas = candidate / "schemas"
    if not schemas.is_dir():
        schemas = live_policy_dir / "schemas"
    try:
        checked = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [
                opa_bin,
                "check",
                "--strict",
                "--format",
                "json",
                "--schema",
                str(schemas),
                str(candidate),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        raise CandidateBroken("`opa check` could not run (SESSIONSTATE_OPA_BIN)") from None
    if checked.returncode != 0:
        errors = _check_errors(checked.stdout + checked.stderr, f"{candidate}/")
        raise CandidateBroken(
            f"the candidate {candidate} does not pass `opa check --strict`: " + "; ".join(errors)
        )


def _check_errors(output: str, prefix: str) -> list[str]:
    try:
        found = [
            f"{error['location']['file'].removeprefix(prefix)}:{error['location']['row']}: "
            f"{error['code']}: {error['message']}"
            if isinstance(error.get("location"), dict)
            else f"{error['code']}: {error['message']}"
            for error in json.loads(output[output.find("{") :])["errors"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        found = ["run `opa check --strict` on it to see why"]
    unique = list(dict.fromkeys(found))
    if len(unique) > MAX_ERRORS:
        unique = [*unique[:MAX_ERRORS], f"and {len(unique) - MAX_ERRORS} more"]
    return unique


class CandidateEngine:
    """The candidate served by a locked-down OPA, asked many decisions at once."""

    def __init__(self, sidecar: OpaSidecar, connections: int = CONNECTIONS) -> None:
        self.revision = sidecar.policies.served.revision
        self._transport = KeepAliveTransport(sidecar.url, sidecar.token, QUERY_TIMEOUT_SECONDS)
        self._pool = ThreadPoolExecutor(connections, thread_name_prefix="impact-query")

    def decide(self, batch: Sequence[LoggedDecision]) -> list[Verdict]:
        """The candidate's answers to the batch's inputs, in order."""
        return list(self._pool.map(self._ask, batch))

    def _ask(self, logged: LoggedDecision) -> Verdict:
        assert logged.input is not None
        encoded = json.dumps(logged.input, separators=(",", ":")).encode()
        answer = self._transport.query(logged.package, logged.input, encoded)
        if not isinstance(answer, dict):
            raise CandidateUnavailable("the candidate's OPA stopped answering; no report")
        if bundle_revision(answer.get("provenance") or {}) != self.revision:
            raise CandidateUnavailable("the candidate's OPA decided with another revision")
        return _verdict(answer.get("result"))

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        self._transport.close()


def _verdict(result: Any) -> Verdict:
    """The answer as the service would take it: anything but a decision denies."""
    if (
        isinstance(result, dict)
        and isinstance(result.get("allow"), bool)
        and isinstance(result.get("reasons"), list)
        and all(isinstance(reason, str) for reason in result["reasons"])
    ):
        return Verdict(allow=result["allow"], reasons=sorted(set(result["reasons"])))
    return Verdict(allow=False, reasons=[Reason.POLICY_ENGINE_UNAVAILABLE.value])


@contextmanager
def served(opa_bin: str, candidate: Path) -> Iterator[CandidateEngine]:
    """The candidate on a sidecar of its own, for the run; stopped and its work dir gone after."""
    with tempfile.TemporaryDirectory(prefix="sessionstate-impact-opa-") as work_dir:
        sidecar = OpaSidecar(opa_bin, candidate, Path(work_dir) / "opa")
        try:
            sidecar.start()
        except PolicySourceError as error:
            raise CandidateBroken(str(error)) from None
        engine = CandidateEngine(sidecar)
        try:
            yield engine
        finally:
            engine.close()
            sidecar.stop()
