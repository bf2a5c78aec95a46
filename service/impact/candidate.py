"""The candidate policy set: checked as `make test` checks policies, then served for the run.

The check is `opa check --strict` against the input schema (the candidate's own
`schemas/` when it has one, else the live policy directory's), so a candidate
that would not pass `make test` is refused before anything is evaluated. The
candidate is then served by an `OpaSidecar` of its own, on a scratch work dir,
with the service's lock-down (a Unix socket in a private directory, a bundle
from a loopback bundle server; the `system.authz` rule it adds for the batch
query matters only to an OPA locked with a token). Beside the candidate's files (a copy: the
candidate itself is never changed) it serves one more query, which decides a
batch of inputs, each by the package of its action exactly as the service's
query would: one HTTP round trip per decision costs some twenty times what
OPA's evaluation does (bench/impact_bench.py). The report names the
candidate's own revision: the one the service would log once it serves it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.api.reasons import Reason
from service.impact.compare import LoggedDecision
from service.impact.report import Verdict
from service.policy.batch import BATCH_PACKAGE, batch_answers, batch_document, batch_module
from service.policy.bundle import load_bundle
from service.policy.client import bundle_revision, decision_result
from service.policy.opa_errors import check_errors
from service.policy.sidecar import OpaSidecar
from service.policy.source import PolicySourceError
from service.policy.transport import KeepAliveTransport

QUERY_TIMEOUT_SECONDS = 30.0


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
        errors = check_errors(
            checked.stdout + checked.stderr,
            f"{candidate}/",
            fallback="run `opa check --strict` on it to see why",
        )
        raise CandidateBroken(
            f"the candidate {candidate} does not pass `opa check --strict`: " + "; ".join(errors)
        )


# Served beside the candidate, never part of it: the batch query (`service.policy.batch`), and
# the sidecar's `system.authz` admits that one query too, for the run's token only.
_BATCH_AUTHZ = """package system.authz

allow if {
	count(opa.runtime().env.SESSIONSTATE_OPA_TOKEN) >= 32
	input.identity == opa.runtime().env.SESSIONSTATE_OPA_TOKEN
	input.method == "POST"
	object.keys(object.get(input, "params", {})) <= {"provenance"}
	input.path == ["v1", "data", "sessionstate", "impact_batch", "decision"]
}
"""
BATCH_SIZE = 500  # inputs per query
CONNECTIONS = 2  # queries in flight: OPA evaluates one while the next is sent or read


def served_copy(candidate: Path, into: Path) -> Path:
    """The candidate's files with the batch query beside them, in a scratch directory."""
    shutil.copytree(candidate, into)
    helper = into / "sessionstate" / BATCH_PACKAGE
    helper.mkdir(parents=True, exist_ok=True)
    (helper / "batch.rego").write_text(batch_module())
    (into / "system" / "authz").mkdir(parents=True, exist_ok=True)
    (into / "system" / "authz" / "impact_batch.rego").write_text(_BATCH_AUTHZ)
    return into


class CandidateEngine:
    """The candidate served by a locked-down OPA, asked a batch of decisions per query."""

    def __init__(
        self, sidecar: OpaSidecar, candidate_revision: str, connections: int = CONNECTIONS
    ) -> None:
        self.revision = candidate_revision
        self._served_revision = sidecar.policies.served.revision
        self._transport = KeepAliveTransport(sidecar.url, sidecar.token, QUERY_TIMEOUT_SECONDS)
        self._pool = ThreadPoolExecutor(connections, thread_name_prefix="impact-query")

    def decide(self, decisions: Sequence[LoggedDecision]) -> list[Verdict]:
        """The candidate's answers to the decisions' inputs, in order."""
        batches = [
            decisions[start : start + BATCH_SIZE] for start in range(0, len(decisions), BATCH_SIZE)
        ]
        return [verdict for answers in self._pool.map(self._ask, batches) for verdict in answers]

    def _ask(self, batch: Sequence[LoggedDecision]) -> list[Verdict]:
        document = batch_document([(logged.package, logged.input or {}) for logged in batch])
        encoded = json.dumps(document, separators=(",", ":")).encode()
        answer = self._transport.query(BATCH_PACKAGE, document, encoded)
        if not isinstance(answer, dict):
            raise CandidateUnavailable("the candidate's OPA stopped answering; no report")
        if bundle_revision(answer.get("provenance") or {}) != self._served_revision:
            raise CandidateUnavailable("the candidate's OPA decided with another revision")
        return [_verdict(result) for result in batch_answers(answer.get("result"), len(batch))]

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        self._transport.close()


def _verdict(result: Any) -> Verdict:
    """The answer as the service would take it: anything but a decision denies, as undefined."""
    decided = decision_result(result)
    if decided is None:
        return Verdict(allow=False, reasons=[Reason.POLICY_DECISION_UNDEFINED.value])
    return Verdict(allow=decided[0], reasons=decided[1])


@contextmanager
def served(opa_bin: str, candidate: Path) -> Iterator[CandidateEngine]:
    """The candidate on a sidecar of its own, for the run; stopped and its work dir gone after."""
    revision = load_bundle(candidate).revision
    with tempfile.TemporaryDirectory(prefix="sessionstate-impact-opa-") as work_dir:
        scratch = Path(work_dir)
        sidecar = OpaSidecar(opa_bin, served_copy(candidate, scratch / "policies"), scratch / "opa")
        try:
            sidecar.start()
        except PolicySourceError as error:
            why = str(error).partition("cannot be served: ")[2] or "it does not compile"
            raise CandidateBroken(f"the candidate {candidate} cannot be served: {why}") from None
        engine = CandidateEngine(sidecar, revision)
        try:
            yield engine
        finally:
            engine.close()
            sidecar.stop()
