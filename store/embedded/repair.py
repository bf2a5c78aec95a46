"""Repairing a corrupt database with LevelDB's repairer, and saying what it dropped.

LevelDB's `RepairDB` rebuilds the MANIFEST from the table and log files it
finds: it converts logs into tables, keeps the readable entries of a damaged
table, and moves what it replaced into `lost/`. What it drops it writes to the
database's `LOG`. Those lines are read back into a fixed vocabulary, because
some of them quote stored keys. The repair then reopens the database, reading
every block, and verifies the decision chain: what was dropped from the middle
of the chain shows as a gap there.

Its log reader does not check record checksums: a log record with a flipped
payload byte is kept as it reads. So the logs' checksums are checked here
first, and the report counts the records that fail (the chain, or a record's
digest, then finds what they changed).
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar

import plyvel
from pydantic import BaseModel, ConfigDict, Field

from store.backends.leveldb import LevelDBLaneStore
from store.chain.checkpoints import CheckpointVerifier
from store.chain.head import GENESIS
from store.chain.signed_head import verify_every_chain
from store.chain.walk import ChainVerification
from store.embedded.integrity import StoreBusy, StoreUnavailable, classify
from store.embedded.log_tail import checksum_failures, torn_log_tail
from store.key_codec import TenantResourceLane

LogDropReason = Literal[
    "checksum_mismatch",
    "bad_record_length",
    "partial_record_without_end",
    "missing_start_of_fragmented_record",
    "error_in_middle_of_record",
    "unknown_record_type",
    "log_record_too_small",
    "read_error",
    "other",
]
TableDamageReason = Literal[
    "block_checksum_mismatch", "not_a_table", "bad_block", "unreadable", "corruption", "other"
]
_Reason = TypeVar("_Reason", bound=str)
_LOG_DROP_REASONS: tuple[tuple[str, LogDropReason], ...] = (
    ("checksum mismatch", "checksum_mismatch"),
    ("bad record length", "bad_record_length"),
    ("partial record without end", "partial_record_without_end"),
    ("missing start of fragmented record", "missing_start_of_fragmented_record"),
    ("error in middle of record", "error_in_middle_of_record"),
    ("unknown record type", "unknown_record_type"),
    ("log record too small", "log_record_too_small"),
    ("IO error", "read_error"),
)
_TABLE_DAMAGE_REASONS: tuple[tuple[str, TableDamageReason], ...] = (
    ("block checksum mismatch", "block_checksum_mismatch"),
    ("not an sstable", "not_a_table"),
    ("bad block", "bad_block"),
    ("IO error", "unreadable"),  # a truncated table reads past its end
    ("Corruption", "corruption"),
)
_LOG_DROP = re.compile(r"Log #([0-9]+): dropping ([0-9]+) bytes; (.*)$")
_LOG_SKIP = re.compile(r"Log #([0-9]+): ignoring ")
_LOG_SAVED = re.compile(r"Log #([0-9]+): ([0-9]+) ops saved to Table #")
_TABLE_MISSING = re.compile(r"Table #([0-9]+): dropped: ")
_TABLE_KEY = re.compile(r"Table #([0-9]+): unparsable key ")
_TABLE_REPAIRED = re.compile(r"Table #([0-9]+): ([0-9]+) entries repaired")
_TABLE_SCANNED = re.compile(r"Table #([0-9]+): ([0-9]+) entries (.*)$")
_ARCHIVED = re.compile(r"Archiving .*/([0-9]+\.(?:log|ldb|sst)|MANIFEST-[0-9]+): OK")


class LogDrop(BaseModel):
    model_config = ConfigDict(extra="forbid")

    log_file: str
    bytes: int = Field(ge=0)
    reason: LogDropReason


class TableDamage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    table_file: str
    reason: TableDamageReason
    entries_kept: int = Field(default=0, ge=0, description="entries copied into its repaired table")


class RepairFindings(BaseModel):
    """What LevelDB's repairer wrote to `LOG`, in a fixed vocabulary."""

    model_config = ConfigDict(extra="forbid")

    log_drops: list[LogDrop] = []
    dropped_log_bytes: int = 0
    skipped_log_batches: int = Field(default=0, description="log records that were not a batch")
    log_operations_recovered: int = 0
    damaged_tables: list[TableDamage] = []
    missing_tables: list[str] = []
    unparsable_keys: int = 0
    archived_files: list[str] = Field(default=[], description="moved into lost/")

    @property
    def dropped_anything(self) -> bool:
        return bool(
            self.log_drops
            or self.skipped_log_batches
            or self.damaged_tables
            or self.missing_tables
            or self.unparsable_keys
        )


class RepairReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    database: str
    torn_log_tail_bytes: int = Field(ge=0, description="dropped silently at the last open")
    log_records_failing_checksum: int = Field(
        ge=0, description="log records whose crc32c fails; the repairer keeps them as they read"
    )
    records_before: dict[str, int] | None = Field(description="per lane; null: it did not open")
    repair: RepairFindings
    dropped: bool = Field(description="the repairer dropped or skipped something it found")
    records_after: dict[str, int] | None
    reopen_problem: str | None = Field(description="why it still does not open, if it does not")
    chain: ChainVerification | None = Field(
        description="the first decision chain that does not verify, else the longest one"
    )
    ok: bool = Field(description="it opens and the decision chain verifies")


def repair(path: Path, verifier: CheckpointVerifier | None = None) -> RepairReport:
    """Run LevelDB's repairer on the database at path; refused (`StoreBusy`) while it is open.
    The chains' retention anchors are checked with `verifier` (the checkpoint key's)."""
    if not path.is_dir():
        raise StoreUnavailable(path, "there is no database there")
    torn = torn_log_tail(path)
    before = _records_before(path)
    with _holding_lock(path):
        failing = sum(checksum_failures(log.read_bytes()) for log in _logs(path))
        try:
            plyvel.repair_db(str(path), paranoid_checks=True, compression=None)
        except plyvel.Error as error:
            raise classify(path, error) from None
    findings = read_repair_log(_repair_log_text(path), path / "lost")
    after: dict[str, int] | None = None
    chain: ChainVerification | None = None
    problem: str | None = None
    try:
        lanes = LevelDBLaneStore(path, read_every_block=True)
    except StoreUnavailable as error:
        problem = str(error)
    else:
        try:
            after = _records(lanes)
            chains = verify_every_chain(lanes, verifier)
            # The first chain that does not verify, else the longest one (every one holds).
            broken = [result for result in chains.values() if not result.ok]
            chain = (
                broken[0]
                if broken
                else max(chains.values(), key=lambda result: result.entries, default=_EMPTY)
            )
        finally:
            lanes.close()
    return RepairReport(
        database=str(path),
        torn_log_tail_bytes=torn,
        log_records_failing_checksum=failing,
        records_before=before,
        repair=findings,
        dropped=torn > 0 or findings.dropped_anything,
        records_after=after,
        reopen_problem=problem,
        chain=chain,
        ok=chain is not None and chain.ok,
    )


def read_repair_log(text: str, lost: Path) -> RepairFindings:
    """Findings from the repairer's `LOG` lines; no line is repeated."""
    found = RepairFindings()
    damaged: dict[int, TableDamage] = {}
    for line in text.splitlines():
        if match := _LOG_DROP.search(line):
            found.log_drops.append(
                LogDrop(
                    log_file=_file_name(int(match[1]), ("log",), lost),
                    bytes=int(match[2]),
                    reason=_reason(match[3], _LOG_DROP_REASONS, "other"),
                )
            )
        elif _LOG_SKIP.search(line):
            found.skipped_log_batches += 1
        elif match := _LOG_SAVED.search(line):
            found.log_operations_recovered += int(match[2])
        elif match := _TABLE_MISSING.search(line):
            found.missing_tables.append(_file_name(int(match[1]), ("ldb", "sst"), lost))
        elif _TABLE_KEY.search(line):
            found.unparsable_keys += 1
        elif match := _TABLE_REPAIRED.search(line):
            if int(match[1]) in damaged:
                damaged[int(match[1])].entries_kept = int(match[2])
        elif (match := _TABLE_SCANNED.search(line)) and match[3].strip() != "OK":
            damaged[int(match[1])] = TableDamage(
                table_file=_file_name(int(match[1]), ("ldb", "sst"), lost),
                reason=_reason(match[3], _TABLE_DAMAGE_REASONS, "other"),
            )
        elif match := _ARCHIVED.search(line):
            found.archived_files.append(match[1])
    found.dropped_log_bytes = sum(drop.bytes for drop in found.log_drops)
    found.damaged_tables = list(damaged.values())
    return found


def _reason(status: str, vocabulary: tuple[tuple[str, _Reason], ...], default: _Reason) -> _Reason:
    return next((ours for theirs, ours in vocabulary if theirs in status), default)


def _file_name(number: int, suffixes: tuple[str, ...], lost: Path) -> str:
    names = [f"{number:06d}.{suffix}" for suffix in suffixes]
    return next((name for name in names if (lost / name).exists()), names[0])


def _repair_log_text(path: Path) -> str:
    # The repairer starts a fresh LOG (the old one becomes LOG.old) and writes only its own lines.
    try:
        return (path / "LOG").read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def _logs(path: Path) -> list[Path]:
    return [log for log in path.glob("*.log") if log.stem.isdigit()]


def _records_before(path: Path) -> dict[str, int] | None:
    """Records per lane if the database opens and reads; refuses (`StoreBusy`) if it is held."""
    try:
        lanes = LevelDBLaneStore(path, read_every_block=True)
    except StoreBusy:
        raise
    except StoreUnavailable:
        return None
    try:
        return _records(lanes)
    finally:
        lanes.close()


def _records(lanes: LevelDBLaneStore) -> dict[str, int]:
    return {lane.value: lanes.count(lane) for lane in TenantResourceLane}


@contextmanager
def _holding_lock(path: Path) -> Iterator[None]:
    """Hold LevelDB's own LOCK (an fcntl lock, as LevelDB takes it): the repairer takes none."""
    handle = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StoreBusy(path) from None
        yield
    finally:
        os.close(handle)


_EMPTY = ChainVerification(ok=True, entries=0, head_hash=GENESIS.hash)
