"""Offline review of a data dir's decision log: verify, export, tail, checkpoint, prune, and
recording what a cut chain lost (`record_loss`).

These open the data dir's own store (the embedded LevelDB) directly, so the
service must be stopped (LevelDB admits one process); they never need OPA or
the network. They open it for review, which reads every block of the database
once: a corrupt store is reported as corrupt, not reviewed in part.
`open_store` opens any configured store the same way (a shared one, such as
PostgreSQL, is read while the service runs, by a client of its own).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.config.store import StoreTarget, embedded_target
from service.decisions.evidence_bundle import (
    BundleSelection,
    BundleTree,
    EvidenceBundle,
    write_bundle,
)
from service.decisions.log import prune_log
from service.decisions.migration import verify_legacy_checkpoint
from service.decisions.reader import DecisionLogReader
from store.backends.contract import ExpectationFailed, Lanes, Mode
from store.chain import signed_head
from store.chain.checkpoints import KEY_FILE, Checkpoint, CheckpointSigner, CheckpointVerifier
from store.chain.evidence import EvidenceChain
from store.chain.head import NO_TENANT_CHAIN, SYSTEM_CHAIN, format_timestamp
from store.chain.keys import LEGACY_CHAIN, is_chain_name, legacy_chain_present, tenant_chain_names
from store.chain.signed_head import (
    ChainUnverified,
    verified_checkpoint,
    verify_every_chain,
    whole_walk,
)
from store.chain.walk import ChainVerification
from store.embedded.integrity import StoreBusy, StoreCorrupt, StoreUnavailable
from store.secrets import SecretsHome


class ReviewError(RuntimeError):
    """A review that cannot be done as asked; the message says why."""


class DataDirBusy(ReviewError):
    """The service holds the database; stop it first."""


class DataDirCorrupt(ReviewError):
    """The database does not read: restore it or repair it before a review."""


@contextmanager
def open_lanes(data_dir: Path) -> Iterator[Lanes]:
    """The data dir's own store, opened for review."""
    with open_store(embedded_target(data_dir), data_dir) as lanes:
        yield lanes


@contextmanager
def open_store(store: StoreTarget, data_dir: Path) -> Iterator[Lanes]:
    """A configured store, opened for review and closed at the end of the block;
    `FileNotFoundError` when the data dir holds none yet."""
    if not store.present:
        raise FileNotFoundError(f"no sessionstate database under {data_dir}")
    try:
        lanes = store.open(Mode.REVIEW)
    except StoreBusy:
        raise DataDirBusy(
            f"cannot open {store.target}: the service (or another review) holds it, and LevelDB "
            "admits one process: stop the service first, or review a copy of the data dir"
        ) from None
    except StoreCorrupt as error:
        raise DataDirCorrupt(str(error)) from None
    except StoreUnavailable as error:
        raise ReviewError(str(error)) from None
    try:
        yield lanes
    finally:
        lanes.close()


class AllChainsVerification(BaseModel):
    """Every chain of a data dir, verified: ok only when each one is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    entries: int = Field(ge=0, description="entries that verified, over every chain")
    chains: dict[str, ChainVerification] = Field(description="by chain: the tenant id")


def verify(
    data_dir: Path,
    secrets: SecretsHome,
    checkpoint_file: Path | None = None,
    public_key_file: Path | None = None,
    tenant_id: str | None = None,
) -> ChainVerification:
    """Verify one tenant's chain; against a kept checkpoint, with a public key kept apart.

    The chain is `tenant_id`'s, else the checkpoint's, else the only one there is. A
    checkpoint signed before chains were per tenant (it names none) is checked against
    the old entries rebuilt from the migrated ones (`migration.verify_legacy_checkpoint`).
    Without `public_key_file` the deployment's own key is used, which proves less: whoever
    can read it can also re-sign. It is never created here. The same key checks
    the chain's retention anchor.
    """
    checkpoint = None
    if checkpoint_file is not None:
        try:
            checkpoint = Checkpoint.model_validate_json(checkpoint_file.read_text())
        except ValueError:
            raise ReviewError(f"{checkpoint_file} is not a sessionstate checkpoint") from None
        verifier: CheckpointVerifier | None = _verifier(secrets, public_key_file)
    else:
        verifier = anchor_verifier(secrets, public_key_file)
    with open_lanes(data_dir) as lanes:
        if checkpoint is not None and verifier is not None and checkpoint.tenant_id is None:
            if not legacy_chain_present(lanes):
                return verify_legacy_checkpoint(lanes, checkpoint, verifier)
            return EvidenceChain(lanes, LEGACY_CHAIN).verify(checkpoint, verifier)
        name = tenant_id or (checkpoint.tenant_id if checkpoint is not None else None)
        if name is None:
            chains = tenant_chain_names(lanes)
            if len(chains) > 1:
                raise ReviewError(
                    "each tenant's decisions are a chain of their own: name one with --tenant, "
                    "or verify every one with --all-tenants"
                )
            name = chains[0] if chains else NO_TENANT_CHAIN
        if checkpoint is None:  # held against the head the service remembers, as it signs
            return whole_walk(EvidenceChain(lanes, name), verifier)
        return EvidenceChain(lanes, name).verify(checkpoint, verifier)


def every_chain_verified(
    lanes: Lanes, verifier: CheckpointVerifier | None
) -> AllChainsVerification:
    """Verify every chain of an open store (PostgreSQL: while the service runs), retention
    anchors checked with `verifier` (`anchor_verifier`)."""
    chains = verify_every_chain(lanes, verifier)
    return AllChainsVerification(
        ok=all(result.ok for result in chains.values()),
        entries=sum(result.entries for result in chains.values()),
        chains=chains,
    )


def only_chain(lanes: Lanes) -> str:
    chains = tenant_chain_names(lanes)
    if len(chains) > 1:
        raise ReviewError(
            "each tenant's decisions are a chain of their own: name one with --tenant"
        )
    return chains[0] if chains else NO_TENANT_CHAIN


def public_key(secrets: SecretsHome) -> bytes:
    """PEM of the checkpoint signing key, for reviewers to pin and keep apart."""
    if not secrets.holds(KEY_FILE):
        raise ReviewError(
            f"no checkpoint key ({KEY_FILE} in {secrets.folder}): none was made here yet, or it "
            "was removed (a removed key may itself be evidence); verify against the public key "
            "you pinned with --public-key"
        )
    return CheckpointSigner.of(secrets).public_key_pem


def anchor_verifier(
    secrets: SecretsHome, public_key_file: Path | None = None
) -> CheckpointVerifier | None:
    """What checks retention anchors: the pinned key, else the deployment's if it has one (with
    none, a stored anchor cannot verify); never created here."""
    if public_key_file is not None:
        return CheckpointVerifier(public_key_file.read_bytes())
    signer = CheckpointSigner.existing(secrets)
    return None if signer is None else signer.verifier()


def _verifier(secrets: SecretsHome, public_key_file: Path | None) -> CheckpointVerifier:
    if public_key_file is not None:
        return CheckpointVerifier(public_key_file.read_bytes())
    return CheckpointVerifier(public_key(secrets))


def checkpoint(data_dir: Path, secrets: SecretsHome, tenant_id: str | None = None) -> Checkpoint:
    """A signed checkpoint of a tenant's head, only after its whole chain verified (as over
    HTTP). Without `tenant_id`, of the only chain there is.

    Raises `ChainUnverified`, naming the first problem, for a chain that does not.
    """
    with open_lanes(data_dir) as lanes:
        name = tenant_id or only_chain(lanes)
        result, signed = verified_checkpoint(EvidenceChain(lanes, name), secrets, datetime.now(UTC))
    if signed is None:
        raise ChainUnverified.of(result, "checkpoint")
    return signed


def bundle(
    data_dir: Path,
    secrets: SecretsHome,
    out: Path,
    tenant_id: str | None = None,
    since: str | None = None,
    until: str | None = None,
    tree: BundleTree | None = None,
) -> EvidenceBundle:
    """Write an evidence bundle to `out`, whole or not at all (`service.decisions.evidence_bundle`);
    `tree` names the log's origin and witnesses (None: the default origin, no witnesses).

    Refused, with `ChainUnverified`, for a chain that does not verify, as `checkpoint` is;
    with `ValueError` without a tenant when the data dir holds more than one chain.
    """
    selection = selection_of(tenant_id=tenant_id, since=since, until=until)
    with open_lanes(data_dir) as lanes:
        handle, scratch = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        try:
            with os.fdopen(handle, "wb") as sink:
                made = write_bundle(
                    sink,
                    DecisionLogReader(lanes),
                    secrets,
                    selection,
                    datetime.now(UTC),
                    tree or BundleTree(),
                )
                sink.flush()
                os.fsync(sink.fileno())
            os.replace(scratch, out)
        except BaseException:
            Path(scratch).unlink(missing_ok=True)
            raise
    return made


_OPTION_HINTS = {  # what each option takes, as a reviewer would type it
    "tenant_id": "--tenant: a tenant id",
    "action": "--action: a policy action, e.g. write",
    "since": "--since: an RFC 3339 time with a time zone, e.g. 2026-01-01T00:00:00Z",
    "until": "--until: an RFC 3339 time with a time zone, e.g. 2026-02-01T00:00:00Z",
}


def selection_of(**values: str | None) -> BundleSelection:
    """A selection of entries from the command line (a bundle's, an impact run's); a bad value
    is named, never repeated."""
    try:
        return BundleSelection.model_validate(values)
    except ValidationError as error:
        hints = [
            _OPTION_HINTS.get(
                str(detail["loc"][0]) if detail["loc"] else "", "--until: after --since"
            )
            for detail in error.errors()
        ]
        raise ReviewError("invalid " + "; ".join(dict.fromkeys(hints))) from None


def export_lines(data_dir: Path, tenant_id: str | None = None) -> Iterator[str]:
    """NDJSON lines in OPA's decision log field names, optionally of one tenant."""
    with open_lanes(data_dir) as lanes:
        for line in DecisionLogReader(lanes).export(tenant_id):
            yield line.rstrip("\n")


def tail(data_dir: Path, count: int) -> list[dict[str, Any]]:
    """The newest `count` entries, oldest first."""
    with open_lanes(data_dir) as lanes:
        return DecisionLogReader(lanes).newest(count)


def record_loss(lanes: Lanes, secrets: SecretsHome, chain: str) -> dict[str, Any]:
    """Record, as an entry of its own, what `chain` lost under the signed head the service
    remembers for it (`store.chain.signed_head.record_loss`), so the service takes entries on it
    again; the entry as written. `secrets` holds the checkpoint key the head is checked
    with; `lanes` is the data dir's LevelDB (the service stopped) or the configured PostgreSQL."""
    if not is_chain_name(chain):
        raise ReviewError("--tenant: a tenant id (or ~no-tenant, ~system)")
    members = {
        "recorded_at": format_timestamp(datetime.now(UTC)),
        "target": {"tenant_id": None if chain in (NO_TENANT_CHAIN, SYSTEM_CHAIN) else chain},
    }
    try:
        return signed_head.record_loss(EvidenceChain(lanes, chain), secrets, members)
    except signed_head.NothingLost as nothing:
        raise ReviewError(str(nothing)) from None
    except ExpectationFailed:
        raise ReviewError("the chain changed while the loss was recorded: run it again") from None


def prune(data_dir: Path, secrets: SecretsHome, older_than_days: int) -> int:
    """Retention's rule, with anchors signed by the deployment's checkpoint key."""
    now = datetime.now(UTC)
    with open_lanes(data_dir) as lanes:
        signer = CheckpointSigner.of(secrets)
        return prune_log(lanes, now - timedelta(days=older_than_days), signer, now)
