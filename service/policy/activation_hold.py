"""Two people for production: a new policy revision waits for the operators who approve it.

With `SESSIONSTATE_POLICY_ACTIVATION_APPROVALS` at N above 1, a reload that finds a new
policy set which passes every check (`service.policy.source`'s `stage`) does not serve it:
the set waits here (`pending`) while OPA goes on deciding with the revision it had. It goes
live once N distinct operators stand behind it: the operator whose `policy reload` asked
for it (a reload by `system`, a bare SIGHUP or a watcher, counts for nobody) and each
operator whose `sessionstate policy approve <revision>` the `sessionstate.approval` policy
allows (`policy.approve`; the live revision decides, never the one that waits). A revision
already activated on the deployment (as the store records it: another replica's approval,
say) is served at once, as is the set a first start serves.

A reload that stages another revision puts it in place of the one waiting (whose approvals
lapse with it); one that finds the directory back at the live revision, or refuses it,
withdraws the one waiting: what waits is what the source holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from service.policy.activation import SYSTEM_ACTOR, ActivationHow, OperatorIdentity
from service.policy.source import StagedPolicies

MAX_APPROVALS = 3
POLICY_ACTIVATION_NOT_PENDING = "policy_activation_not_pending"
POLICY_ACTIVATION_DENIED = "policy_activation_denied"
AWAITING_APPROVAL = "policy_activation_awaiting_approval"  # the /readyz warning


@dataclass(frozen=True)
class PendingActivation:
    """A revision that waits for its approvals: how and by whom it was asked for."""

    staged: StagedPolicies
    how: ActivationHow
    requested_by: str
    requested_at: float
    requester_counts: bool = False  # an identity provider's deployment operator asked
    approved_by: tuple[str, ...] = field(default=())

    @property
    def revision(self) -> str:
        return self.staged.revision

    @property
    def operators(self) -> tuple[str, ...]:
        """Who stands behind it so far: its requester (a deployment operator's reload, with
        an identity provider's token) and its approvers."""
        asked = (self.requested_by,) if self.requester_counts else ()
        return asked + self.approved_by


@dataclass(frozen=True)
class ApprovalVerdict:
    """What the `sessionstate.approval` policy decided of one operator's approval."""

    allow: bool
    reasons: tuple[str, ...] = ()


class ActivationHold:
    """The revision that waits for approval, if any, under one deployment's rule."""

    def __init__(self, approvals: int = 1) -> None:
        if not 1 <= approvals <= MAX_APPROVALS:
            raise ValueError(f"approvals must be 1 to {MAX_APPROVALS}")
        self.approvals = approvals
        self._pending: PendingActivation | None = None
        self._lock = threading.Lock()
        # The revision the deployment's latest live activation made live, as the store
        # records it (any instance's); None: none yet. Until the store is attached, none.
        self.deployment_revision: Callable[[], str | None] = lambda: None

    @property
    def pending(self) -> PendingActivation | None:
        return self._pending

    def hold(
        self, staged: StagedPolicies, how: ActivationHow, asked_by: OperatorIdentity
    ) -> PendingActivation | None:
        """The activation that now waits for `staged` (None: serve it at once)."""
        with self._lock:
            if self.approvals == 1 or self._is_deployments(staged.revision):
                self._pending = None
                return None
            kept = self._pending
            if kept is not None and kept.revision == staged.revision:
                return kept  # asked again: its approvals stand
            who = asked_by.actor.sub
            counts = asked_by.stands_alone and who != SYSTEM_ACTOR
            self._pending = PendingActivation(staged, how, who, time.time(), counts)
            return self._pending

    def start_refusal(self, revision: str) -> str | None:
        """Why a start may not serve `revision` (None: it may): where approvals are asked
        for, a start serves the revision the deployment activated last, or, the first time,
        any; a new one is reloaded into a running service, and approved there."""
        if self.approvals == 1:
            return None
        try:
            live = self.deployment_revision()
        except Exception as error:  # fail closed: nothing is known to be approved
            return f"the deployment's policy activations cannot be read ({type(error).__name__})"
        if live is None or live == revision:
            return None
        return (
            f"SESSIONSTATE_POLICY_ACTIVATION_APPROVALS={self.approvals}: the policy revision "
            f"{revision} is not the revision this deployment activated last ({live}), so it "
            "is not approved; start with that revision, then `sessionstate policy reload` the "
            "new one and have it approved (`sessionstate policy approve`)"
        )

    def approved_elsewhere(self) -> bool:
        """The revision that waits here has gone live on the deployment meanwhile (another
        instance's approvals): it need wait no more."""
        pending = self._pending
        return pending is not None and self._is_deployments(pending.revision)

    def _is_deployments(self, revision: str) -> bool:
        try:
            return self.deployment_revision() == revision
        except Exception:  # fail closed: unknown, so it waits
            return False

    def withdraw(self) -> PendingActivation | None:
        """The source no longer holds what waited: it waits no more (the one withdrawn)."""
        with self._lock:
            withdrawn, self._pending = self._pending, None
            return withdrawn

    def waiting_for(self, revision: str) -> PendingActivation | None:
        pending = self._pending
        return pending if pending is not None and pending.revision == revision else None

    def approve(self, pending: PendingActivation, approver: str) -> PendingActivation | None:
        """`approver`'s approval counted: the activation if it has them all now (to serve),
        else None (it waits on, with one more)."""
        with self._lock:
            if self._pending is not pending:
                raise ValueError("another revision waits now")
            approved = replace(pending, approved_by=(*pending.approved_by, approver))
            if len(set(approved.operators)) >= self.approvals:
                self._pending = None
                return approved
            self._pending = approved
            return None
