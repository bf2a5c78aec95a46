"""When the client tries a call again, and how long it waits first.

A call is safe to repeat when doing it twice does no more than doing it once:
every GET, DELETE (revoking twice keeps the first revocation), a PUT with
`If-Match` or `If-None-Match` (a repeat of a write that did land fails its
precondition with 412 instead of writing again), the two read-only POSTs
(state preview and replay preview) and the token exchange. Granting an
approval and a PUT without a precondition are not.

Three kinds of failure are retried, and nothing else:

- a `429` answer, on any call: the service answers 429 `rate_limited` before
  it asks the policy or does anything, so sending it again cannot do anything
  twice;
- a `503` answer, on calls that are safe to repeat only. Most 503s did nothing,
  but `store_outcome_unknown` says the store's commit was cut off and the call
  may have landed; and a 503 may come from a proxy in front of the service. So
  a grant or an unconditional PUT is never sent again after a 503;
- a connection failure or timeout, on calls that are safe to repeat only: the
  first attempt may have taken effect.

Waits grow exponentially from `backoff` (with jitter, so that many clients do
not retry in step), and never undercut the service's `Retry-After`. A
`Retry-After` longer than `max_wait` ends the retries at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

MAX_WAIT_SECONDS = 30.0
RATE_LIMITED = 429  # refused before anything was done: any call may be sent again
UNAVAILABLE = 503  # may have been done (store_outcome_unknown): only a call safe to repeat


def retried(status: int, safe: bool) -> bool:
    """Whether an answer of this status is tried again, for a call safe to repeat or not."""
    return status == RATE_LIMITED or (status == UNAVAILABLE and safe)


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 2
    backoff: float = 0.2
    max_wait: float = MAX_WAIT_SECONDS

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff < 0 or self.max_wait < 0:
            raise ValueError("retries, backoff and max_wait must not be negative")

    def wait(self, attempt: int, retry_after: float | None = None) -> float | None:
        """Seconds to wait after failed attempt number `attempt` (from 1); None: give up."""
        if attempt > self.retries:
            return None
        if retry_after is not None and retry_after > self.max_wait:
            return None
        jitter = random.uniform(0.5, 1.0)  # noqa: S311 - spreading retries, not a secret
        exponential = min(self.backoff * 2.0 ** (attempt - 1) * jitter, self.max_wait)
        return max(exponential, retry_after or 0.0)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """`Retry-After` in seconds: delta-seconds or an HTTP date; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
