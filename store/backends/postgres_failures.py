"""Why a PostgreSQL store could not be used, named apart: the login refused, no such
database, a read-only standby, or no server reached.

A failed connect carries no SQLSTATE (libpq hands back no result for it, so psycopg's
`sqlstate` is None): the server's reason is in the error's message, which libpq
builds from the server's own (`FATAL:  password authentication failed for user …`,
`FATAL:  database … does not exist`). `connect_failure` reads that message for the
phrases PostgreSQL's English messages use, and says nothing more than the kind: the
message itself (which names the user, the host and the database) is never shown. A
server answering in another language, or any other failure, is `unreachable`, as
before. A statement refused on a standby (`SQLSTATE 25006`, read-only transaction)
is `read_only`.
"""

from __future__ import annotations

import enum
import re

import psycopg
from psycopg import errors as pg_errors


class StoreFailure(enum.Enum):
    """What stopped the store, with the sentence an operator reads (after the target)."""

    AUTHENTICATION_FAILED = "refused the login: the user or its password is wrong"
    DATABASE_UNKNOWN = "has no such database: create it, or name another"
    READ_ONLY = "is a read-only standby (SQLSTATE 25006): give the primary, or a string with target_session_attrs=read-write"
    UNREACHABLE = "cannot be reached"


# What libpq's message quotes of the server's FATAL: a wrong password (or, by design, an
# unknown user under password authentication), an unknown role under trust or peer, no
# such database.
_AUTHENTICATION = re.compile(
    r'authentication failed for user "|FATAL:  role "[^"]*" does not exist'
)
_NO_DATABASE = re.compile(r'FATAL:  database "[^"]*" does not exist')


# libpq's own, when no host of the string takes writes (target_session_attrs=read-write).
_READ_ONLY = re.compile(r"session is read-only|server is in hot standby mode")


def connect_failure(error: psycopg.Error) -> StoreFailure:
    """The kind of failure `error` (from a connect, or a statement) says."""
    said = str(error)
    if isinstance(error, pg_errors.ReadOnlySqlTransaction) or _READ_ONLY.search(said):
        return StoreFailure.READ_ONLY
    if _AUTHENTICATION.search(said):
        return StoreFailure.AUTHENTICATION_FAILED
    if _NO_DATABASE.search(said):
        return StoreFailure.DATABASE_UNKNOWN
    return StoreFailure.UNREACHABLE


def diagnosed(conninfo: str, timeout: float) -> StoreFailure:
    """Connect once, outside any pool, and say why it fails (`UNREACHABLE` when it does
    not: the pool's failure was then a moment's)."""
    try:
        psycopg.connect(conninfo, connect_timeout=max(1, round(timeout))).close()
    except psycopg.Error as error:
        return connect_failure(error)
    return StoreFailure.UNREACHABLE
