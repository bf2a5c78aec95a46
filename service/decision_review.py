"""Offline review of a data dir's decision log: verify, export, tail, checkpoint, prune.

These open the LevelDB directly, so the service must be stopped (LevelDB
admits one process); they never need OPA or the network.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from service.decision_log import opa_event, prune_log
from store.checkpoints import Checkpoint, CheckpointSigner
from store.evidence_chain import ChainVerification, EvidenceChain
from store.lanes import LaneStore


class DataDirBusy(RuntimeError):
    """The service holds the database; stop it first."""


@contextmanager
def open_lanes(data_dir: Path) -> Iterator[LaneStore]:
    database = data_dir / "leveldb"
    if not database.is_dir():
        raise FileNotFoundError(f"no sessionstate database under {data_dir}")
    try:
        lanes = LaneStore(database)
    except Exception as error:  # plyvel's IOError for a held lock, named plainly
        raise DataDirBusy(
            f"cannot open {database}: stop the service first (LevelDB admits one process)"
        ) from error
    try:
        yield lanes
    finally:
        lanes.close()


def verify(data_dir: Path, checkpoint_file: Path | None = None) -> ChainVerification:
    checkpoint = None
    if checkpoint_file is not None:
        checkpoint = Checkpoint.model_validate_json(checkpoint_file.read_text())
    verifier = CheckpointSigner.from_data_dir(data_dir).verifier() if checkpoint else None
    with open_lanes(data_dir) as lanes:
        return EvidenceChain(lanes).verify(checkpoint, verifier)


def checkpoint(data_dir: Path) -> Checkpoint:
    with open_lanes(data_dir) as lanes:
        head = EvidenceChain(lanes).head()
    return CheckpointSigner.from_data_dir(data_dir).sign(head, datetime.now(UTC))


def export_lines(data_dir: Path, tenant_id: str | None = None) -> Iterator[str]:
    """NDJSON lines in OPA's decision log field names, optionally of one tenant."""
    with open_lanes(data_dir) as lanes:
        for entry in EvidenceChain(lanes).scan():
            if tenant_id is None or entry["target"]["tenant_id"] == tenant_id:
                yield json.dumps(opa_event(entry))


def tail(data_dir: Path, count: int) -> list[dict[str, Any]]:
    """The newest `count` entries, oldest first."""
    with open_lanes(data_dir) as lanes:
        newest = []
        for entry in EvidenceChain(lanes).scan(reverse=True):
            newest.append(entry)
            if len(newest) == count:
                break
    return list(reversed(newest))


def prune(data_dir: Path, older_than_days: int) -> int:
    with open_lanes(data_dir) as lanes:
        return prune_log(lanes, datetime.now(UTC) - timedelta(days=older_than_days))
