"""`PolicyHealth`: what `/readyz` and `/metrics` say of the policies the sidecars serve.

A single serving process reads it from its own sidecars' sources at each answer. The
workers of `serve --workers N` serve no sidecar: their parent does, and reloads it. So the
parent writes its `PolicyHealth` into the data dir (`workers/policy-health.json`) at start
and after every reload (or approval) of any of its sidecars, and each worker reads that
file: whichever worker answers, it tells of the same reload.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.policy.activation_hold import AWAITING_APPROVAL
from service.policy.signed_bundle import SignedBundleSource
from service.policy.source import (
    POLICY_SOURCE_INVALID,
    RELOAD_OUTCOMES,
    PolicySnapshots,
    PolicySource,
    ReloadOutcome,
)

SHADOW_POLICY_SOURCE_INVALID = "shadow_policy_source_invalid"
# A worker that cannot read its parent's policy health (it is not published yet, say).
POLICY_HEALTH_UNAVAILABLE = "policy_health_unavailable"


class BundleHealth(BaseModel):
    """A signed bundle's refusals (SESSIONSTATE_POLICY_BUNDLE)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rejected: int = Field(ge=0, description="bundles OPA refused")
    rollback: int = Field(ge=0, description="bundles refused as older than the highest serial")


class PolicyHealth(BaseModel):
    """The live policy source's state after the start or the latest reload, and the warnings
    `/readyz` gives of it and of the shadow set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source_valid: bool | None = Field(
        description="the live source compiled and passed its checks at the last reload; "
        "null: no local sidecar (an external OPA)"
    )
    warnings: tuple[str, ...] = ()
    reloads: dict[ReloadOutcome, int] | None = Field(
        default=None, description="reloads by outcome; null: no local sidecar"
    )
    bundle: BundleHealth | None = None


def policy_health(
    source: PolicySnapshots | None, *, awaiting_approval: bool, shadow_refused: bool
) -> PolicyHealth:
    """The health of `source` (the live sidecar's; None: an external OPA decides), with
    whether a revision waits for approvals and whether the shadow's last reload was refused."""
    warnings: list[str] = []
    valid = None if source is None else source.valid
    if valid is False:
        warnings.append(POLICY_SOURCE_INVALID)
    if source is not None:  # the admission checks' codes: policy_decision_undefined
        warnings += source.refusals
    signed = source if isinstance(source, SignedBundleSource) else None
    if valid is False and signed is not None and signed.refused_as is not None:
        warnings.append(signed.refused_as)  # OPA refused the bundle offered last, or a rollback
    if isinstance(source, PolicySource):
        warnings.extend(source.test_warnings())
    if awaiting_approval:  # the old revision decides meanwhile
        warnings.append(AWAITING_APPROVAL)
    if shadow_refused:  # the shadow's directory holds a set it refused
        warnings.append(SHADOW_POLICY_SOURCE_INVALID)
    return PolicyHealth(
        source_valid=valid,
        warnings=tuple(warnings),
        reloads=None
        if source is None
        else {outcome: source.reloads(outcome) for outcome in RELOAD_OUTCOMES},
        bundle=None
        if signed is None
        else BundleHealth(rejected=signed.rejections, rollback=signed.rollbacks),
    )


def publish_policy_health(path: Path, health: PolicyHealth) -> None:
    """Replace the published health at once: a reader sees the old file or the new one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(health.model_dump_json())
    os.replace(partial, path)


def published_policy_health(path: Path) -> PolicyHealth:
    """What the parent published; while it cannot be read, an unknown source and a warning."""
    try:
        return PolicyHealth.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return PolicyHealth(source_valid=None, warnings=(POLICY_HEALTH_UNAVAILABLE,))
