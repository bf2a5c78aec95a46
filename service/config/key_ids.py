"""This replica's key ids held against the store's (`store.deployment_keys`): a replica whose
digest key or checkpoint key differs from those the store recorded stops before it serves,
with one line that names where its key came from, never a value.

Only a provisioned identity (`SESSIONSTATE_SECRETS_DIR`) is recorded: a data dir's own keys,
made on first use on whatever host a command ran, are no deployment's identity, and a store
that recorded them would refuse every replica after. They are still held against what a
provisioned identity recorded."""

from __future__ import annotations

from service.config.configuration_error import ConfigurationError
from service.config.secret_values import (
    DIGEST_KEY_FILE,
    SECRETS_DIR_VARIABLE,
    checkpoint_signer,
    digest_key,
    secrets_home,
)
from service.config.settings import Settings
from store.backends.contract import Lanes
from store.chain.checkpoints import KEY_FILE as CHECKPOINT_KEY_FILE
from store.chain.checkpoints import CheckpointSigner
from store.deployment_keys import (
    DeploymentKeyIds,
    KeyIdsUnreadable,
    held_against,
    recorded_key_ids,
)
from store.digests import DigestKey

_NAMES = {"digest_key": "digest key", "checkpoint_key": "checkpoint key"}


def deployment_key_ids(settings: Settings, *, make: bool = True) -> DeploymentKeyIds:
    """The ids of the keys this replica digests and signs with: a provisioned checkpoint key
    must be there; a data dir's may not be made yet (None), and is not made here. Without
    `make` (a review), a data dir's digest key is not made either (None)."""
    home = secrets_home(settings)
    signer = checkpoint_signer(settings) if home.provisioned else CheckpointSigner.existing(home)
    if make or home.provisioned or settings.digest_key is not None:
        digest: str | None = digest_key(settings).key_id
    else:
        stored = home.stored(DIGEST_KEY_FILE)
        digest = None if stored is None else DigestKey(stored).key_id
    return DeploymentKeyIds(
        digest_key=digest,
        checkpoint_key=None if signer is None else signer.key_id,
    )


def hold_key_ids(lanes: Lanes, settings: Settings, *, review: bool = False) -> DeploymentKeyIds:
    """`ConfigurationError` where this replica's key ids differ from those the store recorded;
    a provisioned identity's are recorded where the store has none. A `review` (a command
    that reads the store) records nothing and makes no key."""
    ours = deployment_key_ids(settings, make=not review)
    try:
        differ = held_against(lanes, ours, record=settings.secrets_dir is not None and not review)
        recorded = recorded_key_ids(lanes) if differ else None
    except KeyIdsUnreadable as error:
        raise ConfigurationError(f"{error}: run `sessionstate db upgrade` to see it") from None
    if recorded is None:
        return ours
    field = differ[0]
    theirs, mine = getattr(recorded, field), getattr(ours, field)
    raise ConfigurationError(
        f"{_source(settings, field)}: the store was first written with {_NAMES[field]} "
        f"{theirs}, this replica's is {mine or 'not made yet'}; every replica must use the same "
        f"keys (provision one folder with `sessionstate secrets init` as {SECRETS_DIR_VARIABLE})"
    )


def _source(settings: Settings, field: str) -> str:
    """Where this replica's key named by field comes from, as the operator configured it."""
    if field == "digest_key" and settings.digest_key is not None:
        return "SESSIONSTATE_DIGEST_KEY"
    name = DIGEST_KEY_FILE if field == "digest_key" else CHECKPOINT_KEY_FILE
    if settings.secrets_dir is not None:
        return f"{SECRETS_DIR_VARIABLE} ({name})"
    return f"SESSIONSTATE_DATA_DIR (secrets/{name})"
