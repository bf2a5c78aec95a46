"""Lane-store throughput beside raw plyvel, measured in the same run.

Prints ops/s for SessionStateStore read (get), synced write (put) and
compare-and-set, and raw plyvel get and synced put of the same bytes, with the
ratio of each to its raw baseline. Run: `make bench` or
`.venv/bin/python bench/store_bench.py [--seconds 2]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import plyvel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store.canonical import canonical_json
from store.digests import DigestKey
from store.lanes import LaneStore
from store.session_state import Precondition, SessionStateStore, state_key
from tests.factories import record, scope


def rate(operation: Callable[[int], None], seconds: float) -> float:
    """Operations per second of operation(i), run for about `seconds`."""
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            operation(count)
            count += 1
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    args = parser.parse_args()
    key = DigestKey(b"b" * 32)
    built = record(key)
    value = canonical_json(built.to_json())

    with tempfile.TemporaryDirectory() as tmp:
        raw = plyvel.DB(str(Path(tmp) / "raw"), create_if_missing=True)
        raw_key = state_key(built.scope).encode()
        raw.put(raw_key, value, sync=True)
        raw_get = rate(lambda i: raw.get(raw_key), args.seconds)
        raw_put = rate(lambda i: raw.put(raw_key, value, sync=True), args.seconds)
        raw.close()

        lanes = LaneStore(Path(tmp) / "lanes")
        store = SessionStateStore(lanes)
        store.write(built)
        lane_get = rate(lambda i: store.read(scope()), args.seconds)
        lane_put = rate(lambda i: store.write(built), args.seconds)

        current = [built.state_digest]
        versions = [record(key, state_id=f"state-{n}") for n in range(2)]

        def compare_and_set(i: int) -> None:
            nxt = versions[i % 2]
            store.write(nxt, Precondition(if_match=current[0]))
            current[0] = nxt.state_digest

        lane_cas = rate(compare_and_set, args.seconds)
        lanes.close()

    print(f"record size: {len(value)} bytes; {args.seconds:.1f} s per figure")
    print(f"{'operation':<34}{'ops/s':>12}{'baseline ops/s':>16}{'ratio':>8}")
    rows = [
        ("read (get + parse + verify)", lane_get, raw_get),
        ("write (synced put, CAS check)", lane_put, raw_put),
        ("compare-and-set (If-Match)", lane_cas, raw_put),
    ]
    for name, ours, baseline in rows:
        print(f"{name:<34}{ours:>12,.0f}{baseline:>16,.0f}{ours / baseline:>8.2f}")
    print(f"{'raw plyvel get':<34}{raw_get:>12,.0f}")
    print(f"{'raw plyvel synced put':<34}{raw_put:>12,.0f}")


if __name__ == "__main__":
    main()
