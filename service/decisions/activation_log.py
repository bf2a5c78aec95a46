"""`ActivationLog`: every policy set OPA is made to decide with, as an entry of the log.

The process that runs a sidecar follows it (`follow`): the set it started with, and each
set a reload made OPA decide with (`OpaSidecar.on_live`), of the live set and of the
shadow one, becomes an entry of the `~system` chain, appended through the decision
journal like any other (sealed, verified, exported, scrubbed with the rest): the
revision, the one this instance activated before, how (start, reload, SIGHUP, the
watcher, a signed bundle's poll), who (the operator a reload's token names, else
`system`), a signed bundle's signer key id and the commit its manifest names. Its summary
key (`service.decisions.activations`) is written in the same batch. For the live set the
same call opens the revision's live interval (`service.decisions.live`).

An activation the log cannot take (the journal is closed, the store fails) is logged as
an error; OPA decides with the set all the same: the reload cannot be undone.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from service.decisions import activations
from service.decisions.activation_approvals import ActivationApprovals
from service.decisions.activations import PolicyActivation, activation_key
from service.decisions.journal import DecisionJournal, JournalClosed
from service.decisions.live import LiveRevisions
from service.decisions.log import SystemEntryBody
from service.policy.activation import SYSTEM_ACTOR, Activated, OperatorIdentity, PolicySet
from service.policy.input import PolicyActor, PolicyTarget
from service.policy.sidecar import OpaSidecar
from service.policy.trace import DecisionTrace, service_engine
from store.backends.contract import Lanes
from store.canonical import canonical_digest, canonical_json
from store.chain.head import format_timestamp

log = logging.getLogger("sessionstate.policy")
ACTIVATION_POLICY = "sessionstate/policy_activation"


def activation_entry_body(activation: PolicyActivation) -> SystemEntryBody:
    """An activation as an entry of the `~system` chain, before the journal seals it."""
    document = activation.model_dump(mode="json")
    trace = DecisionTrace(
        decision_id=activation.decision_id,
        action="policy.activate",
        policy=ACTIVATION_POLICY,
        allow=True,
        reasons=[],
        policy_revision=activation.revision,
        input_digest=canonical_digest(document),
        evaluated_at=activation.at,
        engine=service_engine(),
        latency_ms=0.0,
    )
    operator = activation.who != SYSTEM_ACTOR
    actor = PolicyActor(sub=activation.who, roles=["operator"] if operator else [])
    return SystemEntryBody(decision=trace, actor=actor, target=PolicyTarget(), input=document)


class ActivationLog:
    """Records this instance's policy activations on the `~system` chain."""

    def __init__(
        self,
        journal: DecisionJournal,
        lanes: Lanes,
        live: LiveRevisions,
        *,
        clock: Callable[[], datetime],
        durable_writes: bool = False,
    ) -> None:
        self._journal = journal
        self._durable_writes = durable_writes
        self._lanes = lanes
        self._live = live
        self._clock = clock
        self._previous: dict[PolicySet, str] | None = None  # read once, then kept
        self._followed: list[OpaSidecar] = []
        self._lock = threading.Lock()

    def follow(
        self, sidecar: OpaSidecar, verify_operator: Callable[[str], OperatorIdentity]
    ) -> None:
        """Record the set `sidecar` started with, then each one it reloads; its reloads
        name the operator `verify_operator` finds in a request's token. Where its revisions
        wait for approvals, the approvals are decided and recorded here too."""
        sidecar.verify_operator = verify_operator
        self._followed.append(sidecar)
        sidecar.hold.deployment_revision = lambda: activations.latest_live(self._lanes)
        if sidecar.hold.approvals > 1:
            approvals = ActivationApprovals(
                self._journal,
                sidecar.url,
                sidecar.token,
                approvals=sidecar.hold.approvals,
                durable_writes=self._durable_writes,
                clock=self._clock,
            )
            sidecar.decide_approval = approvals.decide
        self.record(sidecar.started_as())
        sidecar.on_live = self.activated

    def awaiting_approval(self) -> list[str]:
        """The revisions that wait for approvals in the sidecars it follows (`/readyz`)."""
        pending = [sidecar.hold.pending for sidecar in self._followed]
        return [waiting.revision for waiting in pending if waiting is not None]

    def shadow_refused(self) -> bool:
        """Whether the shadow set's latest reload was refused (`/readyz`): the shadow decides
        on with the set it had, which is not the one in its directory."""
        return any(
            sidecar.policy_set == "shadow" and not sidecar.policies.valid
            for sidecar in self._followed
        )

    def activated(self, activated: Activated) -> None:
        """A reload made OPA decide with a set: its live interval (live set), its entry."""
        if activated.policy_set == "live":
            self._live.activate(activated.revision)
        self.record(activated)

    def record(self, activated: Activated) -> dict[str, Any] | None:
        """Append the activation's entry (and its summary key); the entry, or None if the
        log could not take it."""
        with self._lock:
            activation = PolicyActivation(
                at=format_timestamp(self._clock()),
                policy_set=activated.policy_set,
                how=activated.how,
                who=activated.who,
                previous_revision=self._previous_of(activated.policy_set),
                signer_key_id=activated.signer_key_id,
                commit=activated.commit,
                approved_by=list(activated.approved_by),
                approvals_required=activated.approvals_required,
                instance=self._live.instance,
                decision_id="activation-" + uuid.uuid4().hex,
                revision=activated.revision,
            )
            summary = canonical_json(activation.model_dump(mode="json"))
            try:
                entry = self._journal.record_effect(
                    activation_entry_body(activation),
                    status=200,
                    puts=[(activation_key(activation.decision_id), summary)],
                )
            except JournalClosed as error:  # a chain behind its signed head is one too
                log.error(
                    "policy_activation_not_recorded",
                    extra={
                        "policy_revision": activated.revision,
                        "error_type": type(error).__name__,
                    },
                )
                return None
            if self._previous is not None:
                self._previous[activated.policy_set] = activated.revision
            return entry

    def _previous_of(self, policy_set: PolicySet) -> str | None:
        """The revision of `policy_set` this instance activated last, as recorded (None: the
        store did not read; the entry then names none, and it is read again next time)."""
        if self._previous is None:
            try:
                recorded = activations.stored(self._lanes)
            except Exception as error:  # the entry's append will fail and say so
                log.error("policy_activations_unread", extra={"error_type": type(error).__name__})
                return None
            instance = self._live.instance
            self._previous = {a.policy_set: a.revision for a in recorded if a.instance == instance}
        return self._previous.get(policy_set)
