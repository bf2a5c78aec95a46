"""What LevelDB drops from its write-ahead log without a word when it opens.

LevelDB replays its newest `*.log` at open, and treats a record cut short at
the end of the file (a header, a payload, or the fragments of a record whose
last fragment never came) as the end of the log, not as corruption: a writer
that died mid-append leaves exactly that. The bytes are gone once the open has
converted the log into a table, so they are measured here, before the open.

The log is 32 KiB blocks of records, each a 7-byte header (4-byte masked
crc32c, 2-byte little-endian length, 1-byte type) and its payload; a record
longer than a block is split into FIRST, MIDDLE and LAST fragments. The tail
is measured without checking CRCs: a record whose CRC fails makes LevelDB
refuse the open (paranoid checks), so it is never a silent drop. CRCs are
checked, in pure Python, only for a repair (`checksum_failures`): LevelDB's
repairer does not check them, and keeps such a record as it reads.

A drop is also remembered in a small file beside LevelDB's own until the
service has reported it: the open that measures it may be a start-up check in
another process, or an offline review, and the bytes cannot be measured twice.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

BLOCK_SIZE = 32768
HEADER_SIZE = 7
_ZERO, _FULL, _FIRST, _MIDDLE, _LAST = range(5)
# LevelDB ignores files whose names it does not use (its own are numbered, CURRENT, LOCK, LOG...).
UNREPORTED_FILE = "sessionstate-unreported-log-drops"


def torn_tail_length(log: bytes) -> int:
    """Bytes at the end of one log file that do not form a whole record: what LevelDB drops.

    Mirrors LevelDB's log reader (db/log_reader.cc). Where that reader would report
    corruption instead (a bad length inside a full block, a fragment out of order,
    an unknown type), the open fails and nothing is dropped silently: 0.
    """
    whole_end = 0  # just past the last whole record
    pending: int | None = None  # payload bytes of a record whose fragments are still coming
    for block_start in range(0, len(log), BLOCK_SIZE):
        block = log[block_start : block_start + BLOCK_SIZE]
        at_eof = len(block) < BLOCK_SIZE
        offset = 0
        while len(block) - offset >= HEADER_SIZE:
            length = block[offset + 4] | block[offset + 5] << 8
            kind = block[offset + 6]
            end = offset + HEADER_SIZE + length
            if end > len(block):
                if at_eof:
                    break  # a payload cut short at the end of the file
                return 0  # "bad record length": reported
            if kind == _ZERO and length == 0:
                if pending is not None:
                    return 0  # "error in middle of record": reported
                break  # preallocated zeros: LevelDB skips the rest of the block
            # A FULL or FIRST after fragments without payload is tolerated (an old writer's bug).
            if kind in (_FULL, _FIRST) and pending:
                return 0  # "partial record without end": reported
            if kind in (_MIDDLE, _LAST) and pending is None:
                return 0  # "missing start of fragmented record": reported
            if kind in (_FULL, _LAST):
                pending = None
                whole_end = block_start + end
            elif kind == _FIRST:
                pending = length
            elif kind == _MIDDLE and pending is not None:
                pending += length
            else:
                return 0  # an unknown record type: reported
            offset = end
    return len(log) - whole_end


def checksum_failures(log: bytes) -> int:
    """Records of one log file whose framing reads but whose crc32c does not match."""
    failures = 0
    for block_start in range(0, len(log), BLOCK_SIZE):
        block = log[block_start : block_start + BLOCK_SIZE]
        offset = 0
        while len(block) - offset >= HEADER_SIZE:
            length = block[offset + 4] | block[offset + 5] << 8
            end = offset + HEADER_SIZE + length
            if end > len(block) or (block[offset + 6] == _ZERO and length == 0):
                break  # the reader drops the rest of this block
            stored = int.from_bytes(block[offset : offset + 4], "little")
            if _unmask(stored) != crc32c(block[offset + 6 : end]):
                failures += 1
            offset = end
    return failures


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as LevelDB computes it; about 10 MB/s."""
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _unmask(masked: int) -> int:
    # LevelDB stores crc32c rotated right by 15 bits plus a constant (util/crc32c.h).
    rotated = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rotated >> 17) | (rotated << 15)) & 0xFFFFFFFF


def _crc32c_table() -> list[int]:
    table = []
    for index in range(256):
        crc = index
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def newest_log(db_dir: Path) -> Path | None:
    """The write-ahead log LevelDB appended to last (the highest number), if any. Taken
    before every synced write: one `scandir`, no pattern matching (`Path.glob` cost a read
    about 3% of its CPU)."""
    newest, number = None, -1
    try:
        with os.scandir(db_dir) as entries:
            for entry in entries:
                stem, dot, suffix = entry.name.partition(".")
                if suffix == "log" and dot and stem.isdigit() and int(stem) > number:
                    newest, number = entry.name, int(stem)
    except OSError:  # no such directory (yet), or unreadable: no log, as a glob finds none
        return None
    return None if newest is None else db_dir / newest


def torn_log_tail(db_dir: Path) -> int:
    """Bytes at the end of the newest log that opening the database will drop silently."""
    log = newest_log(db_dir)
    if log is None:
        return 0
    try:
        return torn_tail_length(log.read_bytes())
    except OSError:
        return 0  # unreadable: LevelDB's own open says so


LogMark = tuple[str, int] | None  # the newest log's name and size; None: no log


def log_mark(db_dir: Path) -> LogMark:
    """Where the newest log ends now: its name and size (taken before a synced write)."""
    log = newest_log(db_dir)
    if log is None:
        return None
    try:
        return log.name, log.stat().st_size
    except OSError:
        return None


def may_have_landed(db_dir: Path, before: LogMark) -> bool:
    """Whether a write that failed after `before` may still land: the log grew and ends on a
    whole record, so only the sync failed and the next open may replay the record (LevelDB
    says as much: "the log record we just added may or may not show up when the DB is
    re-opened"). False when nothing was appended, or the record is torn (the open drops it).
    An unreadable log counts as grown: when in doubt, the outcome is unknown."""
    after = log_mark(db_dir)
    if after is None or after == before or after[1] == 0:
        return after is None and before is not None  # the log vanished: nobody can say
    return torn_log_tail(db_dir) == 0


def unreported_log_drops(db_dir: Path) -> int:
    """Bytes dropped at earlier opens that no service has reported yet."""
    try:
        text = (db_dir / UNREPORTED_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return 0
    return int(text) if text.isdigit() else 0


def remember_log_drop(db_dir: Path, dropped: int) -> int:
    """Add `dropped` to the unreported bytes, durably; the new total.

    Best effort: if the file cannot be written (a full disk, say), the total is still
    returned for this process to report.
    """
    total = unreported_log_drops(db_dir) + dropped
    if dropped == 0:
        return total
    target = db_dir / UNREPORTED_FILE
    scratch = target.with_name(UNREPORTED_FILE + ".tmp")
    try:
        with open(scratch, "w", encoding="ascii") as handle:
            handle.write(f"{total}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(scratch, target)
        directory = os.open(db_dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:
        pass
    return total


def forget_log_drops(db_dir: Path) -> None:
    """The unreported bytes were reported. If the file stays, they are reported again."""
    with contextlib.suppress(OSError):
        (db_dir / UNREPORTED_FILE).unlink(missing_ok=True)
