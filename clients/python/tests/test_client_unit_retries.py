"""How long the client waits before trying again, and when it stops, as `RetryPolicy` decides.

Waits grow exponentially from `backoff`, scaled by a jitter between one half
and one; they never undercut the service's `Retry-After`, and a `Retry-After`
past `max_wait` ends the retries at once. The jitter is pinned here by
replacing the module's random source, so that every wait is exact.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sessionstate_client import retries
from sessionstate_client.retries import RetryPolicy, parse_retry_after, retried


class Jitter:
    """A stand-in for the `random` module whose `uniform` always gives one end."""

    def __init__(self, end: str) -> None:
        self.end = end

    def uniform(self, low: float, high: float) -> float:
        return low if self.end == "low" else high


@pytest.mark.parametrize(("end", "waits"), [("high", [0.2, 0.4, 0.8]), ("low", [0.1, 0.2, 0.4])])
def test_waits_double_from_the_backoff_within_the_jitter(
    monkeypatch: pytest.MonkeyPatch, end: str, waits: list[float]
) -> None:
    monkeypatch.setattr(retries, "random", Jitter(end))
    policy = RetryPolicy(retries=3, backoff=0.2)
    assert [policy.wait(attempt) for attempt in (1, 2, 3)] == pytest.approx(waits)
    assert policy.wait(4) is None  # the fourth failure is the last attempt's: give up


def test_the_jitter_stays_between_half_and_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[float, float]] = []

    class Recording:
        def uniform(self, low: float, high: float) -> float:
            asked.append((low, high))
            return high

    monkeypatch.setattr(retries, "random", Recording())
    RetryPolicy().wait(1)
    assert asked == [(0.5, 1.0)]


def test_a_wait_never_exceeds_max_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries, "random", Jitter("high"))
    policy = RetryPolicy(retries=10, backoff=1.0, max_wait=5.0)
    assert policy.wait(10) == 5.0


def test_retry_after_is_honoured_unless_it_is_past_the_longest_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retries, "random", Jitter("high"))
    policy = RetryPolicy(retries=2, backoff=0.2)
    assert policy.wait(1, retry_after=3.0) == 3.0  # longer than the backoff: waited
    assert policy.wait(1, retry_after=0.0) == pytest.approx(0.2)  # shorter: the backoff
    assert policy.wait(1, retry_after=30.0) == 30.0  # exactly the longest wait
    assert policy.wait(1, retry_after=30.5) is None
    assert policy.wait(3, retry_after=1.0) is None  # out of attempts whatever it says


def test_no_retries_means_one_attempt() -> None:
    assert RetryPolicy(retries=0).wait(1) is None


@pytest.mark.parametrize("field", ["retries", "backoff", "max_wait"])
def test_a_negative_setting_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        RetryPolicy(**{field: -1})


@pytest.mark.parametrize(
    ("status", "safe", "expected"),
    [
        (429, True, True),
        (429, False, True),  # refused before anything was done: any call
        (503, True, True),
        (503, False, False),  # it may have landed: only a call safe to repeat
        (500, True, False),
        (502, True, False),
        (504, True, False),
        (404, True, False),
        (412, True, False),
    ],
)
def test_which_statuses_are_tried_again(status: int, safe: bool, expected: bool) -> None:
    assert retried(status, safe) is expected


NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("0", 0.0),
        ("7", 7.0),
        ("  12 ", 12.0),
        ("Thu, 01 Jan 2026 00:00:05 GMT", 5.0),
        ("Wed, 31 Dec 2025 23:59:00 GMT", 0.0),  # a date past is no wait
        ("Thu, 01 Jan 2026 00:00:05 -0000", None),  # no known zone: unreadable
        ("1.5", None),
        ("-3", None),
        ("soon", None),
        ("", None),
    ],
)
def test_retry_after_is_read_as_seconds_or_an_http_date(
    value: str | None, seconds: float | None
) -> None:
    assert parse_retry_after(value, NOW) == seconds
