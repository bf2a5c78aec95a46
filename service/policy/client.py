"""`PolicyClient`: asks OPA for one decision per call and fails closed.

Refused connections, timeouts, non-200 answers and answers that are not
OPA's all become `allow = false` with `policy_engine_unavailable`; an OPA
that answers 401 or 403 (it does not accept the service's token) becomes
`allow = false` with `policy_engine_refused`; an answer of OPA's whose
result is undefined or not of the decision schema (`allow` boolean,
`reasons` array of strings) becomes `allow = false` with
`policy_decision_undefined`, under the revision OPA names. The service
answers all three with 503 and does nothing else.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.api.reasons import Reason
from service.api.v1 import DECISION_PACKAGES
from service.policy.grouping import DecisionGroups, ItemAnswer
from service.policy.input import PolicyActor, PolicyDeployment, PolicyInput, PolicyTarget
from service.policy.trace import DecisionBatch, DecisionEngine, DecisionTrace
from service.policy.transport import (
    REFUSED,
    DecisionTransport,
    KeepAliveTransport,
    OpaClientTransport,
    is_unix_url,
)
from store.canonical import encode, sha256_digest

UNKNOWN = "unknown"
MAX_BATCH_ID = 60  # OPA's decision id (a UUID: 36), so that `<id>.<index>` fits in 64

# A fixed, harmless question whose answer proves OPA decides with a loaded policy.
PROBE = PolicyInput(
    action="decisions.read",
    now=0,
    actor=PolicyActor(sub="sessionstate-readiness-probe", roles=[]),
    target=PolicyTarget(tenant_id="readiness-probe"),
    deployment=PolicyDeployment(durable_writes_enabled=False),
)


@dataclass(frozen=True, slots=True)
class EncodedInput:
    """A policy input as OPA receives it: its JSON document and that document's canonical
    bytes (sent, and digested into the trace). Made once per request, so the live and the
    shadow decision send the same bytes, and the decision log's entry holds them as its
    `input` without encoding it again (`service.decisions.log.entry_body`)."""

    policy_input: PolicyInput
    document: dict[str, Any]
    encoded: bytes
    plain: bool = False  # as `store.canonical.encode` says: the bytes read back as document

    @classmethod
    def of(cls, policy_input: PolicyInput) -> EncodedInput:
        document = policy_input.model_dump(mode="json", by_alias=True)
        data, plain = encode(document)
        return cls(policy_input, document, data, plain)


class PolicyClient:
    """A decision per call over a reused connection (service.policy.transport); with
    `grouped`, the decisions of concurrent calls share queries (service.policy.grouping)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 0.25,
        *,
        transport: str = "opa-python-client",
        grouped: bool = False,
    ) -> None:
        self.url = url
        self.timeout = timeout
        # Probes use opa-python-client; an OPA on a Unix socket, which it cannot reach, is
        # asked everything over the kept-alive socket.
        self._opa: DecisionTransport
        if is_unix_url(url):
            self._opa = KeepAliveTransport(url, token, timeout)
        else:
            self._opa = OpaClientTransport(url, token, timeout)
        self._hot: DecisionTransport = (
            KeepAliveTransport(url, token, timeout) if transport == "keep-alive" else self._opa
        )
        # A batch's bytes go as they are: only over the kept-alive transport.
        keep_alive = isinstance(self._hot, KeepAliveTransport)
        self.groups = DecisionGroups(self._ask_alone) if grouped and keep_alive else None
        self._engine_version = UNKNOWN

    def decide(
        self, policy_input: PolicyInput | EncodedInput, *, trace_id: str | None = None
    ) -> DecisionTrace:
        """The decision for policy_input (or its `EncodedInput`, when the same bytes go to a
        shadow too), from the package that owns its action (trace_id: the OpenTelemetry trace
        it was asked in, which the trace records)."""
        if isinstance(policy_input, PolicyInput):
            policy_input = EncodedInput.of(policy_input)
        return self._decide(policy_input, self._hot, trace_id, grouped=self.groups is not None)

    def probe(self) -> DecisionTrace:
        """The decision on `PROBE`: readiness and reloads ask it which revision decides."""
        return self._decide(EncodedInput.of(PROBE), self._opa)

    def _ask_alone(self, package: str, encoded: bytes) -> Any:
        """One query of the hot transport (a decision's, or a batch's): `DecisionGroups`'."""
        return self._hot.query(package, {}, encoded)

    def _decide(
        self,
        question: EncodedInput,
        transport: DecisionTransport,
        trace_id: str | None = None,
        *,
        grouped: bool = False,
    ) -> DecisionTrace:
        policy_input, encoded = question.policy_input, question.encoded
        package = DECISION_PACKAGES[policy_input.action]
        evaluated_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        started = time.perf_counter()
        if grouped and self.groups is not None:
            answer = self.groups.ask(package, encoded)
        else:
            answer = transport.query(package, question.document, encoded)
        latency_ms = round((time.perf_counter() - started) * 1000, 3)
        item = answer if isinstance(answer, ItemAnswer) else None
        allow, reasons, decision_id, revision, version = _read_answer(
            answer if item is None else item.answer
        )
        if version != UNKNOWN:
            self._engine_version = version
        where = None
        if item is not None and item.answer.get("decision_id") == decision_id:
            where = DecisionBatch(decision_id=decision_id, index=item.index, size=item.size)
            decision_id = f"{decision_id}.{item.index}"
        return DecisionTrace(
            decision_id=decision_id,
            action=policy_input.action,
            policy=f"sessionstate/{package}",
            allow=allow,
            reasons=reasons,
            policy_revision=revision,
            input_digest=sha256_digest(encoded),
            evaluated_at=evaluated_at,
            engine=DecisionEngine(version=self._engine_version),
            latency_ms=latency_ms,
            trace_id=trace_id,
            batch=where,
        )

    def close(self) -> None:
        self._opa.close()
        if self._hot is not self._opa:
            self._hot.close()


def _read_answer(answer: Any) -> tuple[bool, list[str], str, str, str]:
    """allow, reasons, decision id, policy revision and engine version; deny on any doubt."""
    failure = (
        Reason.POLICY_ENGINE_REFUSED if answer == REFUSED else Reason.POLICY_ENGINE_UNAVAILABLE
    ).value
    unavailable = (False, [failure], "local-" + uuid.uuid4().hex, UNKNOWN, UNKNOWN)
    if not isinstance(answer, dict):
        return unavailable
    decision_id = answer.get("decision_id")
    if not isinstance(decision_id, str) or not decision_id or len(decision_id) > MAX_BATCH_ID:
        return unavailable
    provenance = answer.get("provenance")
    provenance = provenance if isinstance(provenance, dict) else {}
    decided = decision_result(answer.get("result"))
    if decided is None:  # OPA answered, the policies gave no decision: theirs is the fault
        decided = (False, [Reason.POLICY_DECISION_UNDEFINED.value])
    return (
        *decided,
        decision_id,
        bundle_revision(provenance),
        str(provenance.get("version") or UNKNOWN)[:64],
    )


def decision_result(result: Any) -> tuple[bool, list[str]] | None:
    """A decision's `{allow, reasons}` as allow and its reasons (sorted, each once), or None
    when it is not one: then the decision denies."""
    if (
        not isinstance(result, dict)
        or not isinstance(result.get("allow"), bool)
        or not isinstance(result.get("reasons"), list)
        or not all(isinstance(reason, str) for reason in result["reasons"])
    ):
        return None
    return result["allow"], sorted(set(result["reasons"]))


def bundle_revision(provenance: dict[str, Any]) -> str:
    bundles = provenance.get("bundles")
    if not isinstance(bundles, dict) or not bundles:
        return UNKNOWN
    revisions = sorted(
        f"{name}@{info.get('revision')}" if len(bundles) > 1 else str(info.get("revision"))
        for name, info in bundles.items()
        if isinstance(info, dict)
    )
    return ",".join(revisions) or UNKNOWN
