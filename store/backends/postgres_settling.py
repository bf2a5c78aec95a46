"""`settle`: wait, bounded, until a server process whose COMMIT was cut off has finished it.

When the store's connection breaks while COMMIT is under way, the store learns of
it at once, and the server process behind that connection may not have read the
COMMIT yet, or may be in the middle of it. The write is of unknown outcome either
way; but a caller told so then looks the write up (docs/model-service.md, "An
unknown outcome"), and a lookup that ran before the server finished would find
nothing although the COMMIT then lands.

So, before it answers, the store waits until that process is either gone or
`idle` (outside any transaction) in `pg_stat_activity`: by then the COMMIT has
either committed, and every later snapshot sees it, or rolled back. The wait is
bounded (a second at most): a COMMIT waiting for a synchronous standby stays
`active` until the standby is back, and a server that cannot be asked at once
(a primary that went away) ends the wait. It is best effort, and only where the
process is known: behind a pooler the backend id a connection reports is the
pooler's, not a server process's, so there is nothing to wait for.

`pg_stat_activity` shows the `state` of a process of the same role, which the
store's connections all are.
"""

from __future__ import annotations

import time

import psycopg
from psycopg_pool import ConnectionPool, PoolClosed

POLL_SECONDS = 0.01
STILL_WORKING = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state IS DISTINCT FROM 'idle'"


def settle(pool: ConnectionPool[psycopg.Connection], backend_pid: int, bound: float) -> bool:
    """Whether the process `backend_pid` finished its transaction (or ended) within bound
    seconds; False when it had not, or at the first failure to ask (one try each: a
    database that went away is not waited for)."""
    deadline = time.monotonic() + bound
    while True:
        try:
            with pool.connection(timeout=max(0.0, deadline - time.monotonic())) as conn:
                working = conn.execute(STILL_WORKING, (backend_pid,)).fetchone()
        except (psycopg.Error, PoolClosed):
            return False
        if not working:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
