"""`PostgresLaneStore`: the lane-store contract on PostgreSQL, through psycopg 3 and its pool.

One table, `sessionstate_lanes (tenant_id, key, value)`, primary key
`(tenant_id, key)`: `key` is the `LaneKey`'s encoding and `tenant_id` its
tenant component (`''` for keys that name no tenant). Keys and values are
bytea, and PostgreSQL orders bytea bytewise as LevelDB orders keys, so a scan
is a key range in key order.

Portable SQL only, so the same code can run on engines that shard by tenant:
no advisory locks, no LISTEN/NOTIFY, upserts by primary key. A batch is one
SERIALIZABLE transaction; it touches the tenants of its keys (one tenant when
the caller's keys are one tenant's, and `single_tenant_batches` makes that a
rule). `expect` is read inside that transaction, so the serializable engine
turns a concurrent change into a serialization failure, retried, after which
the expectation is checked again.

Retries: a serialization failure (SQLSTATE 40001) or deadlock (40P01) rolled
the transaction back, so it is retried with a short random backoff. A read is
retried on a dropped connection. A write is retried on a dropped connection
only when COMMIT was not sent yet (the server rolls back a transaction whose
connection is gone). A connection lost while COMMIT was under way leaves the
outcome unknown: `StoreOutcomeUnknown` (raised once the server process has
finished that COMMIT, or after a second: `postgres_settling`, so a lookup
then sees whether it landed), and the store refuses writes
(`StoreUnwritable`) until `reopen()` (which only checks that the database
answers) so that a writer which caches what it wrote reads it again. A
database that cannot be reached raises `StoreOffline`; messages never carry
the connection string or a key.

COMMIT is bounded like any statement. `statement_timeout` does not bound a
COMMIT waiting for a synchronous standby (`synchronous_standby_names` naming
standbys that are not connected, as on a standby promoted with the settings
it copied): the store cancels a COMMIT that has not answered within its
timeout (`postgres_deadlines`). The transaction has then committed locally but
may not be on any standby, so the write is of unknown outcome
(`StoreOutcomeUnknown`, never acknowledged), and the store stays latched until
`reopen()` sees a probe write commit within its bound again.

`write_probe` proves the database takes writes now (for readiness): in one
short transaction it takes the lock every batch's upserts take on the lanes
table and writes the probe row, each step bounded, the COMMIT too.
`sync_standby_missing` says, from the primary's own views, whether COMMITs
wait for a synchronous standby that is not there.

Session state: none that the store relies on, so it works behind a pooler in
transaction mode (PgBouncer's `pool_mode = transaction`). When the server does
not honour the `options` startup parameter (PgBouncer refuses it, or drops it
with `ignore_startup_parameters`), the store says so in `session_options`
(False), sets `statement_timeout` with `SET LOCAL` in each transaction, bounds
single statements from the client (the same watch), turns psycopg's prepared
statements off (`prepare_threshold=None`: a prepared statement lives on one
server connection) and, read-only, begins each read `READ ONLY`. Locks are
taken per transaction (`FOR UPDATE`, `LOCK TABLE`), never per session.

As a backend (store/backends/contract.py) its location is a libpq connection
string, a secret: only `shown` (`host:port/db`) is ever printed. Many
processes share it; `serve` and `review` open it alike, and `read_only` opens
connections whose every transaction is read-only
(`default_transaction_read_only`), so even a bug could not write.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from store.backends import postgres_schema
from store.backends.contract import (
    Backend,
    Capabilities,
    ExpectationFailed,
    LaneBatch,
    LocationInvalid,
    Mode,
    ProbedLanes,
    ProbeWrite,
    RecoveringLanes,
    SchemaVersions,
    StoreOffline,
    StoreOutcomeUnknown,
    StoreUnwritable,
    StoreUpgradeRefused,
)
from store.backends.postgres_deadlines import Deadlines, Watch
from store.backends.postgres_failures import StoreFailure, connect_failure, diagnosed
from store.backends.postgres_schema import LANES_TABLE, NO_TENANT, PROBE_TABLE
from store.backends.postgres_settling import settle
from store.key_codec import (
    LaneKey,
    TenantResourceLane,
    decode_key,
    key_range,
    lane_prefix,
    scope_prefix,
    successor,
)

DEFAULT_MAX_CONNECTIONS = 8
DEFAULT_TIMEOUT_SECONDS = 5.0
READ_ATTEMPTS = 3
SETTLE_SECONDS = 1.0  # how long a COMMIT cut off is given to finish before its 503
CONFLICT_ATTEMPTS = 12
FIRST_PAGE = 64  # a scan's first page: often all a caller reads (the chain's head)
MAX_PAGE = 1024

_GET = f"SELECT value FROM {LANES_TABLE} WHERE tenant_id = %s AND key = %s"  # noqa: S608
_UPSERT = (
    f"INSERT INTO {LANES_TABLE} (tenant_id, key, value) VALUES (%s, %s, %s) "  # noqa: S608
    "ON CONFLICT (tenant_id, key) DO UPDATE SET value = EXCLUDED.value"
)
_GET_MANY = f"SELECT key, value FROM {LANES_TABLE} WHERE tenant_id = %s AND key = ANY(%s)"  # noqa: S608
_HOLD = f"SELECT 1 FROM {LANES_TABLE} WHERE tenant_id = %s AND key = %s FOR UPDATE"  # noqa: S608
_DELETE = f"DELETE FROM {LANES_TABLE} WHERE tenant_id = %s AND key = %s"  # noqa: S608
_COUNT = f"SELECT count(*) FROM {LANES_TABLE} WHERE key >= %s AND key < %s"  # noqa: S608
# The readiness probe: the table lock a batch's upserts take, then a write that must commit.
_PROBE_LOCK = f"LOCK TABLE {LANES_TABLE} IN ROW EXCLUSIVE MODE"
_PROBE_WRITE = (
    f"INSERT INTO {PROBE_TABLE} (tenant_id, name, probed_at) VALUES (%s, %s, now()) "  # noqa: S608
    "ON CONFLICT (tenant_id, name) DO UPDATE SET probed_at = EXCLUDED.probed_at"
)
PROBE_ROW = "readiness"
_OPTIONS_MARKER = "sessionstate.options_applied"  # a placeholder setting: any server takes it
# Whether the primary's COMMITs wait for synchronous standbys that are not connected: the
# names it waits for, and how many of the connected standbys it counts as synchronous.
# `sync_state` is NULL to a role without pg_read_all_stats (then it cannot be told).
_SYNC_STANDBYS = (
    "SELECT current_setting('synchronous_standby_names'), "
    "current_setting('synchronous_commit'), pg_is_in_recovery(), "
    "count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')), "
    "count(*) FILTER (WHERE sync_state IS NULL) "
    "FROM pg_stat_replication"
)
_WAITING_COMMITS = ("on", "remote_write", "remote_apply")
URI_SCHEMES = ("postgresql://", "postgres://")

Connection = psycopg.Connection[tuple[object, ...]]
T = TypeVar("T")


def redacted(conninfo: str) -> str:
    """The connection string without its password, for readiness reports and logs."""
    params = conninfo_to_dict(conninfo)
    params.pop("password", None)
    return make_conninfo(**{name: str(value) for name, value in params.items()})


def synchronous_standbys_wanted(names: str) -> int:
    """How many synchronous standbys `synchronous_standby_names` has COMMIT wait for:
    `FIRST n (…)` and `ANY n (…)` say n, a plain list (or `*`) one, an empty value none."""
    text = names.strip()
    if not text:
        return 0
    words = text.split(None, 2)
    if len(words) >= 2 and words[0].upper() in ("FIRST", "ANY") and words[1].isdigit():
        return int(words[1])
    head = words[0].split("(", 1)[0]
    return int(head) if head.isdigit() else 1


def read_only_conninfo(conninfo: str) -> str:
    """The connection string with every transaction read-only (`options=-c ...`)."""
    params = conninfo_to_dict(conninfo)
    options = str(params.get("options") or "")
    params["options"] = (options + " -c default_transaction_read_only=on").strip()
    return make_conninfo(**{name: str(value) for name, value in params.items()})


def shown_target(params: Mapping[str, object]) -> str:
    """`host:port[,host:port]/db` from libpq parameters: no user, no password, no options."""
    hosts = str(params.get("host") or params.get("hostaddr") or "local").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    pairs = [
        f"{host}:{port}" if port else host
        for host, port in zip(hosts, ports + [""] * (len(hosts) - len(ports)), strict=False)
    ]
    dbname = str(params.get("dbname") or "")
    return ",".join(pairs) + (f"/{dbname}" if dbname else "")


def key_tenant(key: LaneKey) -> str:
    """The `tenant_id` a key's row carries: its tenant component, `''` when it names none."""
    return tenant_id(key.tenant)


def tenant_id(tenant: str) -> str:
    if "\x00" in tenant:  # a text column cannot hold NUL; no scope id has one
        raise ValueError("a tenant id holds a NUL character")
    return tenant or NO_TENANT


class _Batch:
    """Puts, deletes and expectations gathered in the body; sent at commit as one transaction."""

    def __init__(self) -> None:
        self.writes: dict[bytes, tuple[str, bytes | None]] = {}  # the last write of each key
        self.expected: dict[bytes, tuple[str, bytes | None]] = {}

    def put(self, key: LaneKey, value: bytes) -> None:
        self.writes[key.encode()] = (key_tenant(key), bytes(value))

    def delete(self, key: LaneKey) -> None:
        self.writes[key.encode()] = (key_tenant(key), None)

    def expect(self, key: LaneKey, value: bytes | None) -> None:
        self.expected[key.encode()] = (key_tenant(key), None if value is None else bytes(value))

    @property
    def tenants(self) -> set[str]:
        return {tenant for tenant, _ in (*self.writes.values(), *self.expected.values())}


class PostgresLaneStore:
    """The lane store in one PostgreSQL database, reached through a pool of connections.

    `conninfo` is any libpq connection string or URI, multi-host ones included
    (`host=a,b port=p,q target_session_attrs=read-write`). `timeout` bounds the
    wait for a connection, and the connect itself unless conninfo sets
    `connect_timeout`. Opening checks the schema (`postgres_schema.check`): an
    unreachable database raises `StoreOffline`, a wrong schema `SchemaMismatch`.
    """

    NAME: ClassVar[str] = "postgresql"
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        shared=True,
        one_tenant_per_transaction=False,  # unless opened with `single_tenant_batches`
        repair=False,  # PostgreSQL's own tools look after it
        connections=DEFAULT_MAX_CONNECTIONS,
        recovery=True,
        log_tail=False,
        probe=True,
    )
    SETTING_FORMS: ClassVar[str | None] = "a postgresql:// URI or libpq key=value pairs"

    def __init__(
        self,
        conninfo: str,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        single_tenant_batches: bool = False,
        read_only: bool = False,
    ) -> None:
        self.conninfo = redacted(conninfo)
        self.single_tenant_batches = single_tenant_batches
        self.read_only = read_only
        self._timeout = timeout
        self._statement_ms = max(1, round(timeout * 1000))
        self._deadlines = Deadlines("sessionstate-store")
        connect: dict[str, object] = {"autocommit": True}
        params = conninfo_to_dict(conninfo)
        if "connect_timeout" not in params:
            connect["connect_timeout"] = max(1, round(timeout))
        # Whether the server took the `options` startup parameter (None: the string sets its
        # own, which the store leaves alone). False behind a pooler that refuses or drops it:
        # then no session state at all, and the store bounds statements in band.
        self.session_options: bool | None = None
        if "options" not in params:  # a statement that hangs fails (and rolls back) instead
            own = f"-c statement_timeout={self._statement_ms}"
            if read_only:
                own += " -c default_transaction_read_only=on"
            self.session_options = _options_honoured(conninfo, connect | {"options": own})
            if self.session_options:
                connect["options"] = own
            else:  # a prepared statement lives on one server connection, not on ours
                connect["prepare_threshold"] = None
        elif read_only:
            conninfo = read_only_conninfo(conninfo)
        self._in_band = self.session_options is False
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            conninfo,
            kwargs=connect,
            min_size=1,
            max_size=max_connections,
            timeout=timeout,
            # Give up reconnecting soon: the next request starts afresh, so a database that
            # comes back is used at once rather than after a long backoff.
            reconnect_timeout=timeout,
            configure=_read_only_configure if self._in_band and read_only else _configure,
            open=False,
            name="sessionstate",
        )
        self._pool.open(wait=False)
        self._latched = False
        self.write_failures = 0  # writes of unknown outcome so far (each latched the store)
        self.reopens = 0
        self.conflict_retries = 0  # transactions run again after SQLSTATE 40001 or 40P01
        self.connection_retries = 0  # operations run again after a lost connection
        self.hold_timeouts = 0  # `exclusive` holds not had within the timeout (held nothing)
        try:
            self._read(postgres_schema.check)
        except StoreOffline:
            self._pool.close()
            failure = diagnosed(conninfo, timeout)
            if failure is StoreFailure.UNREACHABLE:
                raise
            raise StoreOffline(
                f"the PostgreSQL store at {self.shown(conninfo)} {failure.value}"
            ) from None
        except BaseException:
            self._pool.close()
            raise

    # -- as a backend ----------------------------------------------------------

    @classmethod
    def claims(cls, location: str) -> bool:
        return location.startswith(URI_SCHEMES) or ("://" not in location and "=" in location)

    @classmethod
    def shown(cls, location: str) -> str:
        try:
            params = conninfo_to_dict(location)
        except psycopg.Error:  # its message quotes the string: not shown
            raise LocationInvalid(
                "is not a valid libpq connection string (a postgresql:// URI or key=value pairs)"
            ) from None
        return shown_target(params)

    @classmethod
    def present(cls, location: str) -> bool:
        return True  # a database: opening says whether it answers

    @classmethod
    def open(cls, location: str, mode: Mode) -> PostgresLaneStore:
        return cls(location, read_only=mode is Mode.READ_ONLY)

    @classmethod
    def upgrade(cls, location: str) -> SchemaVersions:
        """Create or upgrade the tables and record the version."""
        try:
            done = postgres_schema.upgrade(location)
        except (psycopg.OperationalError, pg_errors.ReadOnlySqlTransaction) as error:
            failure = connect_failure(error)
            if failure is StoreFailure.UNREACHABLE:
                raise StoreOffline(
                    f"cannot reach the PostgreSQL store at {cls.shown(location)}"
                ) from None
            refused = StoreUpgradeRefused if failure is StoreFailure.READ_ONLY else StoreOffline
            raise refused(
                f"the PostgreSQL store at {cls.shown(location)} {failure.value}"
            ) from None
        except psycopg.Error as error:  # e.g. no right to create tables: the state, not the text
            raise StoreUpgradeRefused(
                f"the PostgreSQL store at {cls.shown(location)} refused the schema upgrade "
                f"(SQLSTATE {error.sqlstate or 'unknown'})"
            ) from None
        return SchemaVersions(done.found, done.now)

    @property
    def capabilities(self) -> Capabilities:
        return replace(
            self.CAPABILITIES,
            one_tenant_per_transaction=self.single_tenant_batches,
            connections=self.max_connections,
        )

    @property
    def max_connections(self) -> int:
        """The pool's size: at most this many connections are open at once."""
        return int(self._pool.max_size)

    # -- reads ---------------------------------------------------------------

    def get(self, key: LaneKey) -> bytes | None:
        tenant, raw = key_tenant(key), key.encode()

        def fetch(conn: Connection) -> bytes | None:
            row = conn.execute(_GET, (tenant, raw)).fetchone()
            return None if row is None else _bytes(row[0])

        return self._read(fetch)

    def get_many(self, keys: Sequence[LaneKey]) -> list[bytes | None]:
        by_tenant: dict[str, list[bytes]] = {}
        for key in keys:
            by_tenant.setdefault(key_tenant(key), []).append(key.encode())

        def fetch(conn: Connection) -> dict[tuple[str, bytes], bytes]:
            found: dict[tuple[str, bytes], bytes] = {}
            for tenant, raws in by_tenant.items():  # one tenant per statement (Citus routes it)
                for raw, value in conn.execute(_GET_MANY, (tenant, raws)).fetchall():
                    found[(tenant, _bytes(raw))] = _bytes(value)
            return found

        found = self._read(fetch) if keys else {}
        return [found.get((key_tenant(key), key.encode())) for key in keys]

    def scan(
        self,
        lane: TenantResourceLane,
        *scope: str,
        reverse: bool = False,
        start: LaneKey | None = None,
        stop: LaneKey | None = None,
    ) -> Iterator[tuple[LaneKey, bytes]]:
        """Keys and values of lane under the leading scope components, in key order; from
        `start` on and before `stop`, when given (bounds of the index range read).

        Read a page at a time, each page one statement: a scan sees every key that
        stays in place while it runs, once and in order; keys written or deleted
        meanwhile may or may not show (LevelDB's scans read one snapshot).
        """
        low, high = key_range(scope_prefix(lane, *scope), start, stop)
        if high is not None and low >= high:
            return
        tenant = tenant_id(scope[0]) if scope else None
        page = FIRST_PAGE
        after: bytes | None = None
        while True:
            rows = self._read(_page_reader(low, high, tenant, after, reverse, page))
            for raw_key, value in rows:
                yield decode_key(raw_key), value
            if len(rows) < page:
                return
            after = rows[-1][0]
            page = min(page * 4, MAX_PAGE)

    def count(self, lane: TenantResourceLane) -> int:
        """Keys in lane, across tenants."""
        low = lane_prefix(lane)
        high = successor(low)

        def counted(conn: Connection) -> int:
            row = conn.execute(_COUNT, (low, high)).fetchone()
            return _int(row[0]) if row is not None else 0

        return self._read(counted)

    # -- writes --------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """False from a write of unknown outcome until a successful `reopen()`."""
        return not self._latched and not self._pool.closed

    def put(self, key: LaneKey, value: bytes, *, sync: bool = True) -> None:
        with self.batch(sync=sync) as batch:
            batch.put(key, value)

    def delete(self, key: LaneKey, *, sync: bool = True) -> None:
        with self.batch(sync=sync) as batch:
            batch.delete(key)

    @contextmanager
    def batch(self, *, sync: bool = True) -> Iterator[LaneBatch]:
        """All puts and deletes inside commit in one transaction, or not at all on error.

        `sync=False` commits without waiting for the WAL flush (`synchronous_commit =
        off`): a crash may lose it, never tear it, as LevelDB's unsynced writes.
        """
        self._check_writable()
        pending = _Batch()
        yield pending  # an error in the body sends nothing
        if not pending.writes and not pending.expected:
            return
        if self.single_tenant_batches and len(pending.tenants) > 1:
            raise ValueError("a batch touches more than one tenant")
        self._commit(pending, sync)

    @contextmanager
    def exclusive(self, key: LaneKey) -> Iterator[None]:
        """Hold key's row (`SELECT … FOR UPDATE` in a READ COMMITTED transaction of its own,
        which writes nothing) until the block ends; other holders wait for it.

        The batches inside commit on other connections while the row is held, so the next
        holder reads what they wrote. A row not stored yet, or a hold not had within the
        store's timeout, holds nothing (the batches' expectations still guard them). Ending
        the hold rolls its transaction back and never raises: it wrote nothing, and a lost
        connection lets go of the row by itself.
        """
        self._check_writable()
        hold = ExitStack()
        watch: Watch | None = None
        try:
            conn = hold.enter_context(self._pool.connection())
            with ExitStack() as steps:
                if self._in_band:  # a pooler's wait for a server: no lock_timeout ends it
                    watch = steps.enter_context(self._deadlines.watch(conn, 2 * self._timeout))
                # Rolled back at the end, never committed: a COMMIT of its row lock would wait
                # for a synchronous standby, and the hold wrote nothing to keep.
                hold.enter_context(conn.transaction(force_rollback=True))
                conn.execute(  # one round trip: no parameters, so all go as one simple query
                    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; "
                    f"SET LOCAL lock_timeout = {int(self._timeout * 1000)}; "
                    f"SET LOCAL statement_timeout = {self._statement_ms}"
                )
                conn.execute(_HOLD, (key_tenant(key), key.encode())).fetchone()
            if watch is not None and watch.fired:  # a cancel was sent: not reused
                raise psycopg.OperationalError("the hold did not answer within the timeout")
        except pg_errors.LockNotAvailable:
            _release(hold)
            self.hold_timeouts += 1
        except (psycopg.Error, PoolClosed) as error:
            if watch is not None and watch.fired:
                conn.close()
            _release(hold)
            raise StoreOffline(f"the store cannot be reached now ({_sqlstate(error)})") from None
        try:
            yield
        finally:
            _release(hold)

    def _check_writable(self) -> None:
        if self._pool.closed:
            raise StoreOffline("the store is closed")
        if self._latched:
            raise StoreUnwritable("a write's outcome is unknown; the store has not been reopened")

    def _commit(self, pending: _Batch, sync: bool) -> None:
        conflicts = 0
        offline = 0
        while True:
            self._check_writable()
            commit_sent = False
            backend_pid: int | None = None  # the server process the COMMIT went to
            watch: Watch | None = None
            steps: Watch | None = None  # behind a pooler: BEGIN to the last write, bounded
            try:
                with self._pool.connection() as conn:
                    try:
                        with ExitStack() as watching, ExitStack() as stepping:
                            if self._in_band:  # a wait for a server: no statement_timeout
                                steps = stepping.enter_context(
                                    self._deadlines.watch(conn, 2 * self._timeout)
                                )
                            with conn.transaction():
                                settings = self._transaction_settings(sync)
                                if settings:
                                    conn.execute(settings)
                                _check_expected(conn, pending)
                                _apply(conn, pending)
                                stepping.close()  # the steps' watch ends before COMMIT
                                if steps is not None and steps.fired:
                                    raise StoreOffline("the store did not answer in time")
                                commit_sent = True  # leaving the block sends COMMIT, watched
                                backend_pid = None if self._in_band else conn.info.backend_pid
                                watch = watching.enter_context(
                                    self._deadlines.watch(conn, self._timeout)
                                )
                    finally:
                        if any(w is not None and w.fired for w in (watch, steps)):
                            conn.close()  # never back to the pool: a cancel may be pending
                if watch is not None and watch.fired:  # COMMIT answered, maybe with a WARNING
                    raise self._unknown("COMMIT did not answer within the store's timeout")
                return
            except (ExpectationFailed, StoreOutcomeUnknown):
                raise
            except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected) as error:
                # The server rolled back: nothing was written, the same batch may run again.
                conflicts += 1
                self.conflict_retries += 1
                if conflicts >= CONFLICT_ATTEMPTS:
                    raise StoreOffline(
                        f"the write kept conflicting with others ({_sqlstate(error)})"
                    ) from None
                time.sleep(random.uniform(0, min(0.002 * 2**conflicts, 0.1)))  # noqa: S311
            except (psycopg.Error, PoolClosed) as error:
                if commit_sent and (_lost(error) or (watch is not None and watch.fired)):
                    if backend_pid is not None and _lost(error):  # a lookup then sees its end
                        settle(self._pool, backend_pid, min(self._timeout, SETTLE_SECONDS))
                    raise self._unknown(
                        "the connection was lost while committing, or COMMIT did not answer "
                        f"within the store's timeout ({_sqlstate(error)})"
                    ) from None
                # Not committed (the server rolls back what it did not see committed).
                if steps is not None and steps.fired:  # it waited its whole bound already
                    raise StoreOffline(
                        f"the store did not answer within its timeout ({_sqlstate(error)})"
                    ) from None
                offline += 1
                if not _lost(error) or offline >= READ_ATTEMPTS or _waited(error):
                    raise StoreOffline(f"the store cannot write now ({_sqlstate(error)})") from None
                self.connection_retries += 1
                self._pool.check()

    def _transaction_settings(self, sync: bool) -> str:
        """What a batch's transaction sets first (one simple query: no parameters)."""
        settings = []
        if self._in_band:  # behind a pooler the session has no statement_timeout of ours
            settings.append(f"SET LOCAL statement_timeout = {self._statement_ms}")
        if not sync:
            settings.append("SET LOCAL synchronous_commit = off")
        return "; ".join(settings)

    def _unknown(self, why: str) -> StoreOutcomeUnknown:
        """Latch the store: a write of unknown outcome (it may have committed, at least
        locally) is never acknowledged, and nothing is written until `reopen()`."""
        self._latched = True
        self.write_failures += 1
        return StoreOutcomeUnknown(f"{why}; the outcome is unknown")

    def expunge(self, lane: TenantResourceLane, *scope: str) -> bool:
        """Nothing more to do: the batch deleted the rows. Their dead tuples stay in the
        table's pages until VACUUM reclaims them and new rows overwrite them, and the
        deleted rows' images in the WAL until its segments are recycled (docs/compliance.md)."""
        self._check_writable()
        return True

    # -- recovery ------------------------------------------------------------

    def room_to_reopen(self) -> bool:
        """Always: PostgreSQL has no local log to replay (`reopen` checks the connection)."""
        return True

    def reopen(self) -> None:
        """Accept writes again once the database answers and a probe write commits within the
        timeout (so not while COMMITs wait for a missing synchronous standby); `StoreOffline`
        while not."""
        if self._pool.closed:
            raise StoreOffline("the store is closed")
        self._read(lambda conn: conn.execute("SELECT 1").fetchone())
        if self.sync_standby_missing():  # known without waiting for a COMMIT
            raise StoreOffline("COMMITs wait for a synchronous standby that is not connected")
        probed = self.write_probe(min(self._timeout, 1.0))
        if probed is not ProbeWrite.COMMITTED:
            raise StoreOffline(f"the store does not take writes now ({probed.value})")
        if self._latched:
            self._latched = False
            self.reopens += 1

    def reachable(self, timeout: float = 1.0) -> bool:
        """Whether the database answers a `SELECT 1` within timeout (for readiness probes)."""
        if self._pool.closed:
            return False
        try:
            with self._pool.connection(timeout=timeout) as conn, self._probing(conn, timeout):
                conn.execute("SELECT 1").fetchone()
        except (psycopg.Error, PoolClosed):
            return False
        return True

    def write_probe(self, timeout: float = 1.0) -> ProbeWrite:
        """Whether a write commits now, within about `timeout` per step (for readiness).

        One transaction: `LOCK TABLE … IN ROW EXCLUSIVE MODE` on the lanes table (the lock
        every batch's upserts take, so a table held from elsewhere in a mode that blocks
        writes fails it), then an upsert of the probe row, committed. `lock_timeout` and
        `statement_timeout` bound the steps, and a watch the COMMIT: one that does not
        answer in time (waiting for a synchronous standby) is `COMMIT_UNCONFIRMED`. Behind
        a pooler one watch bounds the whole transaction, BEGIN included (twice `timeout`):
        a probe that waits for a server connection is `REFUSED`. A probe that fails wrote
        nothing that matters.
        """
        if self._pool.closed:
            return ProbeWrite.REFUSED
        bound = max(1, int(timeout * 1000))
        watch: Watch | None = None
        commit_sent = False
        try:
            with self._pool.connection(timeout=timeout) as conn:
                try:
                    with ExitStack() as watching:
                        if self._in_band:  # BEGIN may wait there too, for a server connection
                            watch = watching.enter_context(self._deadlines.watch(conn, 2 * timeout))
                        with conn.transaction():
                            conn.execute(  # no parameters: one simple query, one round trip
                                f"SET LOCAL lock_timeout = {bound}; "
                                f"SET LOCAL statement_timeout = {bound}"
                            )
                            conn.execute(_PROBE_LOCK)
                            conn.execute(_PROBE_WRITE, (NO_TENANT, PROBE_ROW))
                            commit_sent = True  # leaving the block sends COMMIT, watched
                            if watch is None:
                                watch = watching.enter_context(self._deadlines.watch(conn, timeout))
                finally:
                    if watch is not None and watch.fired:
                        conn.close()
        except (psycopg.Error, PoolClosed):
            cut_off = commit_sent and watch is not None and watch.fired
            return ProbeWrite.COMMIT_UNCONFIRMED if cut_off else ProbeWrite.REFUSED
        return ProbeWrite.COMMIT_UNCONFIRMED if watch and watch.fired else ProbeWrite.COMMITTED

    def sync_standby_missing(self, timeout: float = 1.0) -> bool | None:
        """Whether this primary's COMMITs wait for synchronous standbys that are not connected:
        `synchronous_standby_names` asks for more than `pg_stat_replication` counts as `sync`
        or `quorum` (PostgreSQL matches the names itself), while `synchronous_commit` waits
        for them. None when it cannot be told (the store does not answer, or the role may not
        read `sync_state`: grant it `pg_monitor`, or rely on the probe write's bound)."""
        if self._pool.closed:
            return None
        try:
            with self._pool.connection(timeout=timeout) as conn, self._probing(conn, timeout):
                row = conn.execute(_SYNC_STANDBYS).fetchone()
        except (psycopg.Error, PoolClosed):
            return None
        if row is None:
            return None
        names, commit, in_recovery, synchronous, hidden = row
        wanted = synchronous_standbys_wanted(str(names))
        if in_recovery or not wanted or str(commit) not in _WAITING_COMMITS:
            return False
        if _int(synchronous) >= wanted:
            return False
        return None if _int(hidden) else True

    @property
    def closed(self) -> bool:
        return bool(self._pool.closed)

    def close(self) -> None:
        self._pool.close()
        self._deadlines.close()

    # -- plumbing ------------------------------------------------------------

    def _read(self, work: Callable[[Connection], T]) -> T:
        """Run work on a pooled connection (autocommit: each statement its own transaction)."""
        attempts = 0
        while True:
            try:
                with self._pool.connection() as conn:
                    if not self._in_band:
                        return work(conn)
                    return self._read_in_band(conn, work)
            except postgres_schema.SchemaMismatch:
                raise
            except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, psycopg.Error) as e:
                attempts += 1
                if not _retryable_read(e) or attempts >= READ_ATTEMPTS or _waited(e):
                    raise StoreOffline(f"the store cannot be read now ({_sqlstate(e)})") from None
                if _lost(e):
                    self.connection_retries += 1
                    self._pool.check()
                else:
                    self.conflict_retries += 1
            except PoolClosed:
                raise StoreOffline("the store is closed") from None

    def _read_in_band(self, conn: Connection, work: Callable[[Connection], T]) -> T:
        """Behind a pooler: work bounded from the client (no statement_timeout of the
        session's), in a READ ONLY transaction when the store is read-only. Work the watch
        cut off is not run again: it already waited the store's whole timeout."""
        watch: Watch | None = None
        try:
            with self._deadlines.watch(conn, self._timeout) as watch:
                if not self.read_only:
                    return work(conn)
                with conn.transaction():
                    return work(conn)
        except psycopg.Error as error:
            if watch is not None and watch.fired:
                raise StoreOffline(
                    f"the store did not answer within its timeout ({_sqlstate(error)})"
                ) from None
            raise
        finally:
            if watch is not None and watch.fired:
                conn.close()

    @contextmanager
    def _probing(self, conn: Connection, timeout: float) -> Iterator[None]:
        """A readiness probe's work, behind a pooler bounded from the client by `timeout`: a
        wait for a server connection is no statement, so no `statement_timeout` ends it (nor,
        on PgBouncer, a cancel: the watch then shuts the connection down). A connection whose
        watch fired is closed, never reused."""
        if not self._in_band:  # the server bounds it, and answers (or its connection fails)
            yield
            return
        watch: Watch | None = None
        try:
            with self._deadlines.watch(conn, timeout) as watch:
                yield
        finally:
            if watch is not None and watch.fired:
                conn.close()


def _configure(conn: Connection) -> None:
    # Transactions the store opens (batches) are serializable; single statements autocommit.
    conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE


def _read_only_configure(conn: Connection) -> None:
    # Behind a pooler, read-only: every read is a transaction begun READ ONLY (and so is a
    # batch, which the server then refuses), since no session default survives the pooler.
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    conn.read_only = True


def _options_honoured(conninfo: str, connect: Mapping[str, object]) -> bool:
    """Whether the server applies the `options` startup parameter (connecting once, with a
    marker setting of the store's own beside them): False when it is refused (PgBouncer:
    `unsupported startup parameter`) or silently dropped (no marker: a role's own
    statement_timeout cannot pass for ours). Any other failure: True, and the pool's own
    connects say what is wrong, as before."""
    marked = dict(connect, options=f"{connect['options']} -c {_OPTIONS_MARKER}=on")
    try:
        with psycopg.connect(conninfo, **marked) as conn:  # type: ignore[arg-type]
            row = conn.execute("SELECT current_setting(%s, true)", (_OPTIONS_MARKER,)).fetchone()
    except psycopg.Error as error:
        return "unsupported startup parameter" not in str(error)
    return row == ("on",)


def _page_reader(
    low: bytes,
    high: bytes | None,
    tenant: str | None,
    after: bytes | None,
    reverse: bool,
    limit: int,
) -> Callable[[Connection], list[tuple[bytes, bytes]]]:
    clauses = ["key >= %s"]
    params: list[object] = [low]
    if high is not None:
        clauses.append("key < %s")
        params.append(high)
    if tenant is not None:
        clauses.append("tenant_id = %s")
        params.append(tenant)
    if after is not None:
        clauses.append("key < %s" if reverse else "key > %s")
        params.append(after)
    order = "DESC" if reverse else "ASC"
    query = (
        f"SELECT key, value FROM {LANES_TABLE} WHERE {' AND '.join(clauses)} "  # noqa: S608
        f"ORDER BY key {order} LIMIT %s"
    )
    params.append(limit)

    def read(conn: Connection) -> list[tuple[bytes, bytes]]:
        rows = conn.execute(query, params).fetchall()
        return [(_bytes(key), _bytes(value)) for key, value in rows]

    return read


def _release(hold: ExitStack) -> None:
    # The transaction wrote nothing; the server lets go of a lost connection's rows.
    with suppress(psycopg.Error, PoolClosed):
        hold.close()


def _check_expected(conn: Connection, pending: _Batch) -> None:
    """Every expected key as expected, read in one statement."""
    if not pending.expected:
        return
    by_tenant: dict[str, list[bytes]] = {}
    for raw, (tenant, _) in pending.expected.items():
        by_tenant.setdefault(tenant, []).append(raw)
    stored: dict[tuple[str, bytes], bytes] = {}
    for tenant, keys in by_tenant.items():  # one tenant per statement (Citus routes it)
        for key, value in conn.execute(_GET_MANY, (tenant, keys)).fetchall():
            stored[(tenant, _bytes(key))] = _bytes(value)
    for raw, (tenant, value) in pending.expected.items():
        if stored.get((tenant, raw)) != value:
            raise ExpectationFailed("a key of the batch changed; nothing was written")


def _apply(conn: Connection, pending: _Batch) -> None:
    puts = [
        (tenant, raw, value) for raw, (tenant, value) in pending.writes.items() if value is not None
    ]
    deletes = [(tenant, raw) for raw, (tenant, value) in pending.writes.items() if value is None]
    with conn.cursor() as cursor:
        if puts:
            cursor.executemany(_UPSERT, puts)
        if deletes:
            cursor.executemany(_DELETE, deletes)


def _lost(error: BaseException) -> bool:
    """Whether error means the connection or the server went away (not a refused statement)."""
    if isinstance(error, PoolClosed):
        return False
    if isinstance(error, psycopg.InterfaceError):
        return True
    if isinstance(error, psycopg.OperationalError):
        # Connection failures (08...), shutdowns (57P0x) and a pool that found no connection.
        state = error.sqlstate
        return state is None or state.startswith(("08", "57P"))
    return isinstance(error, pg_errors.ReadOnlySqlTransaction)  # a standby: ask the pool again


def _retryable_read(error: BaseException) -> bool:
    return isinstance(error, pg_errors.SerializationFailure | pg_errors.DeadlockDetected) or _lost(
        error
    )


def _waited(error: BaseException) -> bool:
    """The pool already waited its whole timeout for a connection: asking again waits again."""
    return isinstance(error, PoolTimeout)


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError("a bytea column did not read as bytes")


def _int(value: object) -> int:
    if isinstance(value, int):
        return value
    raise TypeError("a count did not read as an integer")


def _sqlstate(error: BaseException) -> str:
    state = getattr(error, "sqlstate", None)
    return f"SQLSTATE {state}" if state else type(error).__name__


if TYPE_CHECKING:  # it keeps the contract and the capabilities it declares (mypy checks these)
    _BACKEND: type[Backend] = PostgresLaneStore
    _RECOVERS: type[RecoveringLanes] = PostgresLaneStore
    _PROBES: type[ProbedLanes] = PostgresLaneStore
