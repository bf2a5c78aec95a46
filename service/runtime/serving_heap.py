"""The serving process's heap and CPython's cyclic garbage collector.

What a process builds before it serves (modules, the Flask app, pydantic's
schemas, hypercorn, the store's handles: about 100,000 objects) lives as long
as the process. Left in the collector's oldest generation, every full
collection walked all of it: 60 to 135 ms with every request thread held,
2 to 5 times in 8 s of reads at 16 connections, which set their 99th percentile.
`settle()` moves it into the permanent generation (`gc.freeze`), where no
collection looks again, and lets more allocations pass before a young
collection: a request frees almost everything it allocates, so the default
(700) collected every few requests for little. Garbage in cycles is still
collected, only later.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # allocations net of frees between young collections (CPython: 700)


def settle() -> None:
    """Call once everything that serves is built, just before serving."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
