"""The OPA sidecars a serving process starts: the live policy set's (unless
SESSIONSTATE_OPA_URL names an OPA already running) and the shadow set's (when
SESSIONSTATE_SHADOW_POLICIES names a directory and no SESSIONSTATE_SHADOW_OPA_URL
stands instead). Each stops with the process, and dies with it even on SIGKILL
(PR_SET_PDEATHSIG, see `service.policy.sidecar`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.config.settings import Settings
from service.config.store import configured_store
from service.decisions import activations
from service.observability.tracing import OpaTracing
from service.policy.activation_hold import ActivationHold
from service.policy.coverage_gate import CoverageGate
from service.policy.engine_checks import local_opa_bin
from service.policy.sidecar import OpaSidecar
from store.backends.contract import Lanes

log = logging.getLogger("sessionstate.serve")


@dataclass(frozen=True)
class SidecarPlan:
    """What start-up checked before anything started: the live sidecar's binary and policy
    directory (None: the OPA at SESSIONSTATE_OPA_URL decides), the shadow's directory (None:
    no shadow sidecar), the signed bundle and its key, and OPA's tracing."""

    local: tuple[str, Path] | None
    shadow_dir: Path | None
    signed: tuple[Path, Path] | None
    tracing: OpaTracing | None


@dataclass
class Sidecars:
    """The sidecars this process started; None where none was started."""

    live: OpaSidecar | None = None
    shadow: OpaSidecar | None = None

    def start(self, settings: Settings, plan: SidecarPlan) -> None:
        """Start what plan names, the live sidecar first; each is kept as soon as it runs,
        so that `stop` stops it whatever fails next."""
        if plan.local is not None:
            sidecar = _live_sidecar(settings, plan)
            _start_live(settings, sidecar)
            self.live = sidecar
            log.info(
                "opa_sidecar_ready", extra={"policy_revision": sidecar.policies.served.revision}
            )
        if plan.shadow_dir is not None:
            # The shadow follows its directory: every edit that compiles decides beside the live set.
            shadow = OpaSidecar(
                local_opa_bin(settings),
                plan.shadow_dir,
                settings.data_dir / "opa-shadow",
                watch_policies=True,
                policy_set="shadow",
            )
            shadow.start()
            self.shadow = shadow
            log.info(
                "opa_shadow_sidecar_ready",
                extra={"policy_revision": shadow.policies.served.revision},
            )

    def running(self) -> list[OpaSidecar]:
        return [sidecar for sidecar in (self.live, self.shadow) if sidecar is not None]

    def opa(self, settings: Settings) -> tuple[str, str | None]:
        """The URL and token of the OPA that decides: the live sidecar's, or the operator's."""
        if self.live is not None:
            return self.live.url, self.live.token
        assert settings.opa_url is not None  # no sidecar: start-up checked it is set
        return settings.opa_url, settings.opa_token

    def shadow_opa(self, settings: Settings) -> tuple[str | None, str | None]:
        """The URL and token of the shadow OPA: the shadow sidecar's, the operator's, or none."""
        if self.shadow is not None:
            return self.shadow.url, self.shadow.token
        return settings.shadow_opa_url, settings.shadow_opa_token

    def stop(self) -> None:
        for sidecar in self.running():
            sidecar.stop()


def _live_sidecar(settings: Settings, plan: SidecarPlan) -> OpaSidecar:
    assert plan.local is not None
    opa_bin, policy_dir = plan.local
    return OpaSidecar(
        opa_bin,
        policy_dir,
        settings.data_dir / "opa",
        watch_policies=settings.watch_policies,
        bundle_file=None if plan.signed is None else plan.signed[0],
        verification_key=None if plan.signed is None else plan.signed[1],
        verification_alg=settings.policy_verification_alg,
        bundle_pin=settings.policy_bundle_pin,
        tracing=plan.tracing,
        tests=CoverageGate(opa_bin, settings.policy_coverage_min),
        hold=ActivationHold(settings.policy_activation_approvals),
    )


def _start_live(settings: Settings, sidecar: OpaSidecar) -> None:
    """Start it; a signed bundle's serial is checked against the highest the store keeps,
    and recorded there once OPA activated it (`service.policy.rollback`); where new
    revisions wait for approvals, the start's is checked against the deployment's
    (`service.policy.activation_hold`)."""
    if sidecar.signed is None and sidecar.hold.approvals == 1:
        sidecar.start()
        return
    lanes = configured_store(settings).open()  # the service's own opens after the start
    try:
        keep_serials_in(sidecar, lanes)
        sidecar.hold.deployment_revision = lambda: activations.latest_live(lanes)
        sidecar.start()
    finally:
        keep_serials_in(sidecar, None)
        sidecar.hold.deployment_revision = lambda: None  # until the activation log follows it
        lanes.close()


def keep_serials_in(sidecar: OpaSidecar, lanes: Lanes | None) -> None:
    """Where a signed bundle's highest serial is read and recorded from now on."""
    if sidecar.signed is not None:
        sidecar.signed.guard.attach(lanes)


def reloader(sidecar: OpaSidecar | None) -> Callable[[], None]:
    """What SIGHUP does: ask the sidecar's reloader thread to reload the policy snapshot."""
    if sidecar is not None:
        return sidecar.request_reload

    def no_policy_directory() -> None:
        log.warning("policy_reload_not_applicable")  # the OPA at SESSIONSTATE_OPA_URL has them

    return no_policy_directory
