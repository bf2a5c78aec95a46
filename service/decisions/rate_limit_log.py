"""`RateLimitLog`: the decision log's quota for refused requests.

A request refused with 429 `rate_limited` adds no entry of its own. Each
limited actor instead gets at most one summary entry per summary window:
"this actor was refused N times between T1 and T2", with the action and
target of the first refused request and the actor's claims (ids only; no
request content). A summary is appended through the decision journal like
any other entry, so it is sealed on the chain, listed, exported and
verified with the rest. It is flushed when its window ends (a timer checks
every second), when the actor is refused again after that, and at close.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.api.reasons import Reason
from service.auth.tokens import Actor
from service.decisions.journal import ChainBehindSignedHead, DecisionJournal, JournalClosed
from service.decisions.log import DecisionEntryBody
from service.policy.input import PolicyAction, PolicyActor, PolicyTarget
from service.policy.trace import DecisionTrace, service_engine
from service.rate_limits import Budget, RateLimits, Refusal, actor_key
from store.canonical import canonical_digest
from store.chain.head import TIMESTAMP_PATTERN, format_timestamp

log = logging.getLogger("sessionstate.rate_limits")
RATE_LIMIT_POLICY = "sessionstate/rate_limit"


class RateLimitSummary(BaseModel):
    """The `input` of a summary entry: what the service itself decided on, without OPA."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["rate_limit_summary"] = "rate_limit_summary"
    actor: PolicyActor
    action: PolicyAction = Field(description="the action of the first refused request")
    target: PolicyTarget = Field(description="the target of the first refused request")
    refused: int = Field(ge=1, description="requests refused in the window, whatever their target")
    budgets: list[Budget] = Field(description="the budgets that refused them")
    first_at: str = Field(pattern=TIMESTAMP_PATTERN, description="the first refusal")
    last_at: str = Field(pattern=TIMESTAMP_PATTERN, description="the last refusal")
    window_seconds: int = Field(ge=1, description="how long one summary collects refusals")
    limits: dict[Budget, str] = Field(description="the budgets as configured")


@dataclass
class _Episode:
    """An actor's refusals since its first one of the current window."""

    actor: Actor
    action: PolicyAction
    target: PolicyTarget
    first_at: datetime
    last_at: datetime
    refused: int = 1
    budgets: set[Budget] = field(default_factory=set)

    def summary(self, limits: RateLimits) -> RateLimitSummary:
        return RateLimitSummary(
            actor=self.actor.to_policy(),
            action=self.action,
            target=self.target,
            refused=self.refused,
            budgets=sorted(self.budgets),
            first_at=format_timestamp(self.first_at),
            last_at=format_timestamp(self.last_at),
            window_seconds=limits.summary_window_seconds,
            limits=limits.describe(),
        )


def summary_entry_body(summary: RateLimitSummary) -> DecisionEntryBody:
    """A summary as a decision log entry, before the journal dates and seals it."""
    document = summary.model_dump(mode="json")
    trace = DecisionTrace(
        decision_id="ratelimit-" + uuid.uuid4().hex,
        action=summary.action,
        policy=RATE_LIMIT_POLICY,
        allow=False,
        reasons=[Reason.RATE_LIMITED.value],
        policy_revision=canonical_digest(document["limits"]),
        input_digest=canonical_digest(document),
        evaluated_at=summary.first_at,
        engine=service_engine(),
        latency_ms=0.0,
    )
    return DecisionEntryBody(
        decision=trace, actor=summary.actor, target=summary.target, input=document
    )


class RateLimitLog:
    """Collects refusals per actor and appends one summary entry per actor per window."""

    def __init__(
        self,
        journal: DecisionJournal,
        limits: RateLimits,
        *,
        clock: Callable[[], datetime],
        tick_seconds: float = 1.0,
    ) -> None:
        self._journal = journal
        self._limits = limits
        self._window = timedelta(seconds=limits.summary_window_seconds)
        self._clock = clock
        self._tick = tick_seconds
        self._lock = threading.Lock()
        self._open: dict[str, _Episode] = {}
        self._due: list[_Episode] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rate-limit-log", daemon=True)
        self._thread.start()

    def note(
        self, actor: Actor, refusal: Refusal, action: PolicyAction, target: PolicyTarget
    ) -> None:
        """Count one refused request of actor."""
        now = self._clock()
        key = actor_key(actor)
        with self._lock:
            episode = self._open.get(key)
            if episode is not None and now >= episode.first_at + self._window:
                self._due.append(self._open.pop(key))
                episode = None
            if episode is None:
                self._open[key] = _Episode(actor, action, target, now, now, 1, {refusal.budget})
                return
            episode.refused += 1
            episode.last_at = max(episode.last_at, now)
            episode.budgets.add(refusal.budget)

    def flush(self, *, everything: bool = False) -> int:
        """Append the summaries whose window has ended (all of them with `everything`)."""
        now = self._clock()
        with self._lock:
            ended = [
                key
                for key, episode in self._open.items()
                if everything or now >= episode.first_at + self._window
            ]
            due = self._due + [self._open.pop(key) for key in ended]
            self._due = []
        kept = 0
        held: list[_Episode] = []  # of chains behind their signed head: kept, the rest go on
        for number, episode in enumerate(due):
            try:
                body = summary_entry_body(episode.summary(self._limits))
                self._journal.record(body, status=Reason.RATE_LIMITED.status)
            except ChainBehindSignedHead:
                held.append(episode)
                continue
            except JournalClosed:
                # Tried again at the next tick; only close gives up on them.
                with self._lock:
                    self._due.extend(due[number:])
                log.error("rate_limit_summary_not_kept", extra={"summaries": len(due) - number})
                break
            kept += 1
        with self._lock:
            self._due.extend(held)
        return kept

    def close(self) -> None:
        """Stop the timer and append every open summary (before the journal closes)."""
        self._stop.set()
        self._thread.join(5)
        self.flush(everything=True)
        with self._lock:
            lost, self._due = len(self._due), []
        if lost:
            log.error("rate_limit_summaries_lost", extra={"summaries": lost})

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            try:
                self.flush()
            except Exception as error:  # the quota's bookkeeping must never take the service down
                log.error("rate_limit_flush_failed", extra={"error_type": type(error).__name__})
