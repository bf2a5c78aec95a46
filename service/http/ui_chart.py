"""The chart of the reviewer's page: allowed and denied decisions per time bucket.

Laid out here, in Python, as plain numbers for an inline SVG: the page has no
JavaScript, and the template only draws what this computes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

CHART_BUCKETS = (12, 24)  # fewest and most; about two decisions a bucket between
CHART_MAX_ENTRIES = 10_000  # the chart reads at most this many matching entries


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    allowed_y: float
    allowed_height: float
    denied_y: float
    denied_height: float
    title: str


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass(frozen=True)
class Chart:
    """Allowed and denied decisions per equal time bucket, laid out for an inline SVG."""

    bars: list[Bar]
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    allowed: int
    denied: int
    first: datetime
    last: datetime
    truncated: bool
    width: int = 1000
    height: int = 240
    left: int = 44
    right: int = 990
    top: int = 28
    bottom: int = 200


def decision_chart(decisions: Iterable[tuple[str, bool]]) -> Chart | None:
    """Bucket decisions, each (evaluated_at, allow), between the first and the last; None if
    there are none."""
    points: list[tuple[datetime, bool]] = []
    for evaluated_at, allow in decisions:
        if len(points) == CHART_MAX_ENTRIES:
            break
        points.append((datetime.fromisoformat(evaluated_at), allow is True))
    if not points:
        return None
    first, last = min(t for t, _ in points), max(t for t, _ in points)
    span = (last - first) or timedelta(seconds=1)
    buckets = max(CHART_BUCKETS[0], min(CHART_BUCKETS[1], len(points) // 2))
    counts = [[0, 0] for _ in range(buckets)]
    for moment, allow in points:
        counts[min(buckets - 1, int((moment - first) / span * buckets))][0 if allow else 1] += 1
    step, top = _y_scale(max(a + d for a, d in counts))
    slot = (Chart.right - Chart.left) / buckets

    def y(count: int) -> float:
        return round(Chart.bottom - (Chart.bottom - Chart.top) * count / top, 2)

    def clock(fraction: float) -> str:
        return _clock(first + span * fraction, span)

    bars = [
        Bar(
            x=round(Chart.left + slot * index + 1, 2),
            width=round(slot - 2, 2),
            allowed_y=y(allowed),
            allowed_height=round(Chart.bottom - y(allowed), 2),
            denied_y=y(allowed + denied),
            denied_height=round(y(allowed) - y(allowed + denied), 2),
            title=f"{clock(index / buckets)} to {clock((index + 1) / buckets)} UTC: "
            f"{allowed} allowed, {denied} denied",
        )
        for index, (allowed, denied) in enumerate(counts)
    ]
    return Chart(
        bars=bars,
        y_ticks=[Tick(y(n), str(n)) for n in range(0, top + 1, step)],
        x_ticks=[
            Tick(round(Chart.left + (Chart.right - Chart.left) * q / 4, 2), clock(q / 4))
            for q in range(5)
        ],
        allowed=sum(a for a, _ in counts),
        denied=sum(d for _, d in counts),
        first=first,
        last=last,
        truncated=len(points) == CHART_MAX_ENTRIES,
    )


def _y_scale(peak: int) -> tuple[int, int]:
    """A round tick step (1, 2 or 5 x 10^n) giving at most 5 ticks, and the axis top."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            step = factor * magnitude
            if -(-peak // step) <= 4:
                return step, max(step, -(-peak // step) * step)
        magnitude *= 10


def _clock(moment: datetime, span: timedelta) -> str:
    """A time label as fine as the chart's span needs."""
    if span < timedelta(minutes=1):
        return moment.strftime("%H:%M:%S.%f")[:-3]
    if span < timedelta(days=1):
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%m-%d %H:%M")
