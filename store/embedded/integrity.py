"""Opening the LevelDB database, and telling why it would not open.

An open that fails raises one of three exceptions whose message is one line:
what is wrong, the database's path and what to do next. LevelDB's own message
never reaches it (some quote stored bytes, such as a comparator name read from
the MANIFEST): it is matched against a fixed vocabulary instead.

Opening checks more than LevelDB does. A database with table files but no
`CURRENT` is corrupt (LevelDB would start a new one over it and delete the
tables); every table file must have the size the MANIFEST recorded (LevelDB
reads a truncated table as empty); and, when asked, every block is read once
with its checksum verified (a flipped byte in a table shows only on reading).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

import plyvel

REPAIR_ADVICE = (
    "restore the data dir from a backup, or run `sessionstate db repair` (it reports what it drops)"
)
_LEVELDB_FILE = re.compile(r"^(?:[0-9]+\.(?:log|ldb|sst)|MANIFEST-[0-9]+)$")
_TABLE_LINE = re.compile(rb"^ ([0-9]+):([0-9]+)\[", re.MULTILINE)
_CORRUPTIONS = (  # (what LevelDB says, what we say): the first match wins
    ("CURRENT file does not end with newline", "its CURRENT file is empty or damaged"),
    ("CURRENT file corrupted", "its CURRENT file is empty or damaged"),
    ("CURRENT points to a non-existent file", "its CURRENT file names a missing MANIFEST"),
    ("missing files", "table files it lists are missing"),
    ("block checksum mismatch", "a table block fails its checksum"),
    ("checksum mismatch", "a write-ahead log or MANIFEST record fails its checksum"),
    ("not an sstable", "a table file is damaged"),
    ("bad block", "a table file is damaged"),
    ("record", "a write-ahead log or MANIFEST record is damaged"),
)
_STRERRORS = {os.strerror(number).lower() for number in errno.errorcode}


class StoreUnavailable(Exception):
    """The database cannot be opened; `problem` says why in a fixed phrase."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(self.describe())

    def describe(self) -> str:
        return (
            f"the store at {self.path} cannot be opened ({self.problem}): "
            "check the disk, its free space and the directory's permissions"
        )


class StoreBusy(StoreUnavailable):
    """Another process holds LevelDB's LOCK: LevelDB admits one process."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "another process holds its LOCK")

    def describe(self) -> str:
        return (
            f"the store at {self.path} is in use (LevelDB admits one process, and its LOCK "
            "is held): stop the process that holds it first, or work on a copy of the data dir"
        )


class StoreCorrupt(StoreUnavailable):
    """The database's files do not read as LevelDB wrote them."""

    def describe(self) -> str:
        return f"the store at {self.path} is corrupt ({self.problem}): {REPAIR_ADVICE}"


def classify(path: Path, error: plyvel.Error) -> StoreUnavailable:
    """The exception to raise for a LevelDB error, without its message."""
    raw = error.args[0] if error.args else b""
    message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if isinstance(error, plyvel.CorruptionError):
        problem = next(
            (ours for theirs, ours in _CORRUPTIONS if theirs in message),
            "LevelDB reports corruption",
        )
        return StoreCorrupt(path, problem)
    if isinstance(error, plyvel.IOError):
        if message.startswith("IO error: lock "):
            return StoreBusy(path)
        return StoreUnavailable(path, _os_reason(message))
    return StoreUnavailable(path, "LevelDB refuses to open it")


def _os_reason(message: str | None) -> str:
    """The operating system's reason at the end of an I/O error, if it is one we know."""
    tail = (message or "").rsplit(": ", 1)[-1].strip().lower()
    return tail if tail in _STRERRORS else "an I/O error"


def open_leveldb(path: Path) -> Any:
    """The plyvel database at path, created if the directory holds none yet."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        names = os.listdir(path)
    except OSError as error:
        raise StoreUnavailable(path, _os_reason(error.strerror)) from None
    if "CURRENT" not in names and any(_LEVELDB_FILE.match(name) for name in names):
        raise StoreCorrupt(path, "its CURRENT file is missing")
    try:
        # No compression: stored bytes stay greppable, so "no raw text on disk" can be audited.
        return plyvel.DB(str(path), create_if_missing=True, paranoid_checks=True, compression=None)
    except plyvel.Error as error:
        raise classify(path, error) from None


def check_tables(db: Any, path: Path, *, read_every_block: bool) -> None:
    """Every table file the MANIFEST lists has its recorded size; optionally, every block reads."""
    listing: bytes = db.get_property(b"leveldb.sstables") or b""
    for number, size in _TABLE_LINE.findall(listing):
        name = f"{int(number):06d}"
        table = path / f"{name}.ldb"
        if not table.exists() and (path / f"{name}.sst").exists():
            table = path / f"{name}.sst"
        try:
            actual = table.stat().st_size
        except FileNotFoundError:
            raise StoreCorrupt(path, f"table file {table.name} is missing") from None
        except OSError as error:
            raise StoreUnavailable(path, _os_reason(error.strerror)) from None
        if actual != int(size):
            raise StoreCorrupt(path, f"table file {table.name} is truncated or overwritten")
    if read_every_block:
        _read_every_block(db, path)


def _read_every_block(db: Any, path: Path) -> None:
    """Walk every key with checksums verified; unlike plyvel's iterator, stop at a bad table."""
    walk = db.raw_iterator(verify_checksums=True, fill_cache=False)
    try:
        walk.seek_to_first()
        while walk.valid():
            walk.next()
    except plyvel.Error as error:
        raise classify(path, error) from None
    finally:
        walk.close()
