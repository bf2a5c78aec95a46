"""`PolicyClient`: asks OPA for one decision per call and fails closed.

Refused connections, timeouts, non-200 answers, an undefined decision or a
result of the wrong shape all become `allow = false` with
`policy_engine_unavailable`; an OPA that answers 401 or 403 (it does not
accept the service's token) becomes `allow = false` with
`policy_engine_refused`. The service answers both with 503 and does nothing
else.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import requests
from opa_client.opa import OpaClient

from service.contract import DECISION_PACKAGES
from service.policy.input import PolicyActor, PolicyDeployment, PolicyInput, PolicyTarget
from service.policy.trace import DecisionEngine, DecisionTrace
from service.reasons import Reason
from store.canonical import canonical_digest

UNKNOWN = "unknown"
REFUSING_STATUSES = (401, 403)  # OPA's authentication or its system.authz said no

# A fixed, harmless question whose answer proves OPA decides with a loaded policy.
PROBE = PolicyInput(
    action="decisions.read",
    now=0,
    actor=PolicyActor(sub="sessionstate-readiness-probe", roles=[]),
    target=PolicyTarget(tenant_id="readiness-probe"),
    deployment=PolicyDeployment(durable_writes_enabled=False),
)


class PolicyClient:
    """One HTTP round trip per decision over a reused connection pool."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 0.25) -> None:
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https"} or parts.hostname is None:
            raise ValueError("OPA url must be http(s)://host:port")
        self.url = url
        self.timeout = timeout
        self._opa = OpaClient(
            host=parts.hostname,
            port=parts.port or (443 if parts.scheme == "https" else 80),
            ssl=parts.scheme == "https",
            token=token,
            retries=0,  # a retry would stretch the deadline; failing closed is the answer
            timeout=timeout,
        )
        self._engine_version = UNKNOWN

    def decide(self, policy_input: PolicyInput) -> DecisionTrace:
        """The decision for policy_input, from the package that owns its action."""
        package = DECISION_PACKAGES[policy_input.action]
        document = policy_input.model_dump(mode="json", by_alias=True)
        evaluated_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        started = time.perf_counter()
        try:
            answer: Any = self._opa.query_rule(
                input_data=document,
                package_path=f"sessionstate.{package}",
                rule_name="decision",
                query_params={"provenance": "true"},
            )
        except requests.HTTPError as error:
            refused = error.response is not None and error.response.status_code in REFUSING_STATUSES
            answer = Reason.POLICY_ENGINE_REFUSED if refused else None
        except Exception:  # any failure to get an answer denies
            answer = None
        latency_ms = round((time.perf_counter() - started) * 1000, 3)
        allow, reasons, decision_id, revision, version = _read_answer(answer)
        if version != UNKNOWN:
            self._engine_version = version
        return DecisionTrace(
            decision_id=decision_id,
            action=policy_input.action,
            policy=f"sessionstate/{package}",
            allow=allow,
            reasons=reasons,
            policy_revision=revision,
            input_digest=canonical_digest(document),
            evaluated_at=evaluated_at,
            engine=DecisionEngine(version=self._engine_version),
            latency_ms=latency_ms,
        )

    def probe(self) -> DecisionTrace:
        """The decision on `PROBE`: readiness and reloads ask it which revision decides."""
        return self.decide(PROBE)

    def close(self) -> None:
        self._opa.close_connection()


def _read_answer(answer: Any) -> tuple[bool, list[str], str, str, str]:
    """allow, reasons, decision id, policy revision and engine version; deny on any doubt."""
    failure = (
        Reason.POLICY_ENGINE_REFUSED
        if answer == Reason.POLICY_ENGINE_REFUSED
        else Reason.POLICY_ENGINE_UNAVAILABLE
    ).value
    unavailable = (False, [failure], "local-" + uuid.uuid4().hex, UNKNOWN, UNKNOWN)
    if not isinstance(answer, dict):
        return unavailable
    result = answer.get("result")
    decision_id = answer.get("decision_id")
    if (
        not isinstance(result, dict)
        or not isinstance(result.get("allow"), bool)
        or not isinstance(result.get("reasons"), list)
        or not all(isinstance(reason, str) for reason in result["reasons"])
        or not isinstance(decision_id, str)
        or not decision_id
        or len(decision_id) > 64
    ):
        return unavailable
    provenance = answer.get("provenance")
    provenance = provenance if isinstance(provenance, dict) else {}
    return (
        result["allow"],
        sorted(set(result["reasons"])),
        decision_id,
        _revision(provenance),
        str(provenance.get("version") or UNKNOWN)[:64],
    )


def _revision(provenance: dict[str, Any]) -> str:
    bundles = provenance.get("bundles")
    if not isinstance(bundles, dict) or not bundles:
        return UNKNOWN
    revisions = sorted(
        f"{name}@{info.get('revision')}" if len(bundles) > 1 else str(info.get("revision"))
        for name, info in bundles.items()
        if isinstance(info, dict)
    )
    return ",".join(revisions) or UNKNOWN
