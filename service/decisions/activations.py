"""Policy activations as the decision log keeps them: the entry's input, and a summary key.

Each activation of a policy set (`service.decisions.activation_log`) is an entry of the
`~system` chain; in the same batch, one key of its own in that chain's `trace_meta` lane
(`activation:<decision id>`) holds what the entry's input says, so the revisions an
auditor lists (`service.decisions.revisions`) carry their activations from a few keys,
never a walk of the log. Those keys are the deployment's, not a tenant's: which policy set
went live when, how and by whom is the same for every tenant. They keep what was
activated when retention has pruned the entries.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.policy.activation import ActivationHow, PolicySet
from store.backends.contract import Lanes
from store.chain.head import SYSTEM_CHAIN, TIMESTAMP_PATTERN
from store.key_codec import LaneKey, TenantResourceLane

_PREFIX = b"activation:"


class ActivationRecord(BaseModel):
    """One activation of a revision: when, where, how, by whom, from what."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: str = Field(pattern=TIMESTAMP_PATTERN, description="RFC 3339: when OPA decided with it")
    policy_set: PolicySet = Field(
        description="`live`: the set that decides; `shadow`: the shadow set "
        "(SESSIONSTATE_SHADOW_POLICIES), which decides nothing"
    )
    how: ActivationHow = Field(
        description="`start` of the service, `reload` (`sessionstate policy reload`), a bare "
        "`sighup`, the `watcher` of a policy directory, or the `bundle_poll` of a signed bundle "
        "file"
    )
    who: str = Field(
        description="the operator the reload's token named (`policy reload --operator`), "
        "else `system`"
    )
    previous_revision: str | None = Field(
        description="the revision of the same set this instance activated before; null: none"
    )
    signer_key_id: str | None = Field(
        description="a signed bundle's: the sha256 of the verification key it verified with "
        "(`hmac-sha256:` for HS256); null: a policy directory"
    )
    commit: str | None = Field(
        description="the commit its manifest names (`make policy-manifest` in a checkout); "
        "null: none"
    )
    approved_by: list[str] = Field(
        default_factory=list,
        description="the operators whose approvals (`sessionstate policy approve`) it went live "
        "after, where SESSIONSTATE_POLICY_ACTIVATION_APPROVALS asks for more than one "
        "operator; empty otherwise",
    )
    approvals_required: int = Field(
        default=1,
        description="SESSIONSTATE_POLICY_ACTIVATION_APPROVALS when it went live: how many "
        "operators the deployment asked to stand behind it (1 for the shadow set)",
    )
    instance: str = Field(description="the service instance (data dir) that activated it")
    decision_id: str = Field(description="its entry on the `~system` chain")


class PolicyActivation(ActivationRecord):
    """The `input` of an activation entry: the service decided it itself, without OPA."""

    kind: Literal["policy_activation"] = "policy_activation"
    revision: str = Field(description="the revision OPA decides with now")

    def record(self) -> ActivationRecord:
        return ActivationRecord.model_validate(self.model_dump(exclude={"kind", "revision"}))


def activation_key(decision_id: str) -> LaneKey:
    return LaneKey(TenantResourceLane.TRACE_META, SYSTEM_CHAIN, name=_PREFIX + decision_id.encode())


def stored(lanes: Lanes) -> list[PolicyActivation]:
    """Every activation recorded, oldest first (a damaged key is skipped)."""
    found: list[PolicyActivation] = []
    for key, value in lanes.scan(TenantResourceLane.TRACE_META, SYSTEM_CHAIN):
        if key.name.startswith(_PREFIX):
            try:
                found.append(PolicyActivation.model_validate_json(value))
            except ValidationError:
                continue
    return sorted(found, key=lambda a: datetime.fromisoformat(a.at))


def latest_live(lanes: Lanes) -> str | None:
    """The revision the deployment's latest activation of its live set made live (any
    instance's); None when none is recorded."""
    live = [activation for activation in stored(lanes) if activation.policy_set == "live"]
    return live[-1].revision if live else None


def by_revision(activations: Iterable[PolicyActivation]) -> dict[str, list[ActivationRecord]]:
    """The activations of each revision, in the order given."""
    grouped: dict[str, list[ActivationRecord]] = {}
    for activation in activations:
        grouped.setdefault(activation.revision, []).append(activation.record())
    return grouped
