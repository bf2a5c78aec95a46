"""`ActivationApprovals`: an operator's approval of a waiting policy revision, decided and
recorded.

Where the deployment asks for more than one operator behind each new policy revision
(`service.policy.activation_hold`), `sessionstate policy approve <revision>` asks the
`sessionstate.approval` policy (`policy.approve`) of the revision that decides now,
never of the one that waits: may this operator approve it, given who asked for it and who
approved it already? The decision, allowed or not, is an entry of the `~system` chain
with its trace like any other; an approval the log cannot take does not count (fail
closed), nor does one OPA does not answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from service.decisions.journal import DecisionJournal, JournalClosed
from service.decisions.log import SystemEntryBody
from service.policy.activation import OperatorIdentity
from service.policy.activation_hold import ApprovalVerdict, PendingActivation
from service.policy.client import PolicyClient
from service.policy.input import (
    PolicyActivationAsk,
    PolicyDeployment,
    PolicyInput,
    PolicyTarget,
)

log = logging.getLogger("sessionstate.policy")
DECISION_SECONDS = 2.0


class ActivationApprovals:
    """Decides operators' approvals of one sidecar's waiting revision, on the log."""

    def __init__(
        self,
        journal: DecisionJournal,
        opa_url: str,
        opa_token: str | None,
        *,
        approvals: int,
        durable_writes: bool,
        clock: Callable[[], datetime],
    ) -> None:
        self._journal = journal
        self._opa = (opa_url, opa_token)
        self._approvals = approvals
        self._durable_writes = durable_writes
        self._clock = clock

    def decide(
        self, pending: PendingActivation, approver: OperatorIdentity, deciding: str
    ) -> ApprovalVerdict:
        """What the approval policy says of `approver`'s approval of `pending`, while
        `deciding` is the revision OPA decides with; recorded before it counts."""
        policy_input = self._input(pending, approver, deciding)
        client = PolicyClient(*self._opa, timeout=DECISION_SECONDS)  # approvals are rare
        try:
            trace = client.decide(policy_input)
        finally:
            client.close()
        body = SystemEntryBody(
            decision=trace,
            actor=approver.actor,
            target=policy_input.target,
            input=policy_input.model_dump(mode="json", by_alias=True),
        )
        try:
            self._journal.record_effect(body, status=200 if trace.allow else 403)
        except JournalClosed as error:  # a chain behind its signed head is one too
            log.error(
                "policy_approval_not_recorded",
                extra={"policy_revision": pending.revision, "error_type": type(error).__name__},
            )
            return ApprovalVerdict(False, ("approval_not_recorded",))
        return ApprovalVerdict(trace.allow, tuple(trace.reasons))

    def _input(
        self, pending: PendingActivation, approver: OperatorIdentity, deciding: str
    ) -> PolicyInput:
        return PolicyInput(
            action="policy.approve",
            now=int(self._clock().timestamp()),
            actor=approver.actor,
            target=PolicyTarget(),
            deployment=PolicyDeployment(durable_writes_enabled=self._durable_writes),
            activation=PolicyActivationAsk(
                revision=pending.revision,
                previous_revision=deciding,
                requested_by=pending.requested_by,
                approved_by=list(pending.approved_by),
                approvals=self._approvals,
                approver_vouched_by="this_host" if approver.minted_here else "identity_provider",
            ),
        )
