"""`ShadowPolicy`: a candidate policy set that decides beside the live one and decides nothing.

With `SESSIONSTATE_SHADOW_POLICIES` (a second locked-down OPA sidecar serving
that directory) or `SESSIONSTATE_SHADOW_OPA_URL` (an OPA of the operator's),
every request's policy input is also sent to the shadow, at the same time as
to the live OPA. The live decision alone decides. The shadow's answer is
waited for at most `SESSIONSTATE_SHADOW_TIMEOUT_MS` from when both were asked,
so a slow, failing or dead shadow delays no answer beyond that bound and
changes none: its decision is only compared with the live one, kept on the
request's decision entry (`ShadowDecision`) and counted in
`sessionstate_shadow_decisions_total`.

A few threads ask the shadow; when all are busy (a shadow slower than the
requests arrive) a request does not queue for one: its entry says
`unavailable`.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.policy.change import DecisionChange, decision_change
from service.policy.client import EncodedInput, PolicyClient
from service.policy.trace import DecisionTrace

# A change the shadow's decision makes is named as `DecisionChange` names it, but for none,
# which is `agree`; or the shadow made no decision.
ShadowOutcome = Literal[
    "agree",
    DecisionChange.ALLOW_GAINED,
    DecisionChange.ALLOW_LOST,
    DecisionChange.REASONS_CHANGED,
    "unavailable",
    "timeout",
]
THREADS = 8


class ShadowDecision(BaseModel):
    """What the shadow policy set would have decided, beside the live decision of an entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    outcome: ShadowOutcome = Field(
        description="agree; allow_gained (live denied, shadow allows); allow_lost (live "
        "allowed, shadow denies); reasons_changed (same allow, other reasons); or no shadow "
        "decision: unavailable (failed, refused, busy) or timeout (not within the bound)"
    )
    agrees: bool | None = Field(description="null when the shadow made no decision")
    policy_revision: str | None = Field(description="the shadow policy set's revision")
    allow: bool | None
    reasons: list[str]


def compare(live: DecisionTrace, shadow: DecisionTrace) -> ShadowDecision:
    """The shadow's decision beside the live one."""
    if shadow.engine_unavailable:
        return _no_decision("unavailable")
    outcome = _outcome(decision_change(live, shadow))
    return ShadowDecision(
        outcome=outcome,
        agrees=outcome == "agree",
        policy_revision=shadow.policy_revision,
        allow=shadow.allow,
        reasons=shadow.reasons,
    )


def _outcome(change: DecisionChange) -> ShadowOutcome:
    return "agree" if change is DecisionChange.UNCHANGED else change


def _no_decision(outcome: ShadowOutcome) -> ShadowDecision:
    return ShadowDecision(
        outcome=outcome, agrees=None, policy_revision=None, allow=None, reasons=[]
    )


class ShadowQuestion:
    """One input on its way to the shadow; `verdict` waits for it within the bound."""

    def __init__(self, future: Future[DecisionTrace] | None, deadline: float) -> None:
        self._future = future
        self._deadline = deadline

    def verdict(self, live: DecisionTrace) -> ShadowDecision:
        if self._future is None:
            return _no_decision("unavailable")
        try:
            shadow = self._future.result(timeout=max(self._deadline - time.monotonic(), 0.0))
        except FutureTimeout:
            return _no_decision("timeout")
        except Exception:  # the client fails closed itself; anything else is no decision
            return _no_decision("unavailable")
        return compare(live, shadow)


class ShadowPolicy:
    """Asks the shadow OPA beside every live decision, on a few threads of its own."""

    def __init__(
        self, url: str, token: str | None, *, timeout_ms: int, grouped: bool = True
    ) -> None:
        self.bound = timeout_ms / 1000
        self.client = PolicyClient(
            url, token, timeout=self.bound, transport="keep-alive", grouped=grouped
        )
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="shadow")
        self._free = threading.BoundedSemaphore(THREADS)

    def ask(self, encoded: EncodedInput) -> ShadowQuestion:
        deadline = time.monotonic() + self.bound
        if not self._free.acquire(blocking=False):
            return ShadowQuestion(None, deadline)
        try:
            future = self._pool.submit(self._decide, encoded)
        except RuntimeError:  # shutting down
            self._free.release()
            return ShadowQuestion(None, deadline)
        return ShadowQuestion(future, deadline)

    def _decide(self, encoded: EncodedInput) -> DecisionTrace:
        try:
            return self.client.decide(encoded)
        finally:
            self._free.release()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
