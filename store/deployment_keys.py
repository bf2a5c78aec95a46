"""The key ids a store was first written with: its digest key's and its checkpoint key's.

Every replica of a deployment must digest with one key and sign the decision log with one
key, or the same body gets two `state_digest`s and a reviewer must pin a key per replica.
The store remembers the ids of the keys of the first provisioned identity that opened it
(`sessionstate db upgrade` or a service with `SESSIONSTATE_SECRETS_DIR`), one key beside the
legacy chain's meta, and a replica whose keys differ is told so before it serves
(`held_against`). Key ids are no
secrets: a digest names its key's id, a checkpoint its key's.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from store.backends.contract import ExpectationFailed, Lanes
from store.canonical import canonical_json
from store.chain.keys import LEGACY_CHAIN
from store.key_codec import LaneKey, TenantResourceLane

KEY_IDS_KEY = LaneKey(TenantResourceLane.TRACE_META, LEGACY_CHAIN, name=b"deployment_key_ids")
_ATTEMPTS = 3  # another replica recording at the same moment: read again, then compare


class DeploymentKeyIds(BaseModel):
    """The ids of a deployment's digest key and checkpoint key (None: not made yet, as in a
    data dir whose service has signed nothing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digest_key: str | None
    checkpoint_key: str | None = None


class KeyIdsUnreadable(Exception):
    """The stored key ids do not parse: the store was edited, or is damaged."""


def recorded_key_ids(lanes: Lanes) -> DeploymentKeyIds | None:
    """The key ids the store was first written with; None where none were recorded yet."""
    return _parsed(lanes.get(KEY_IDS_KEY))


def _parsed(value: bytes | None) -> DeploymentKeyIds | None:
    if value is None:
        return None
    try:
        return DeploymentKeyIds.model_validate_json(value)
    except ValidationError:
        raise KeyIdsUnreadable("the store's recorded key ids do not parse") from None


def held_against(lanes: Lanes, ours: DeploymentKeyIds, *, record: bool) -> list[str]:
    """Compare `ours` with what the store recorded; the fields that differ, in order. With
    `record`, what the store lacks is recorded (all of it on a new store; the checkpoint
    key's id once one exists).

    A checkpoint key recorded while we have none differs too: we would make a new one.
    """
    for _ in range(_ATTEMPTS):
        stored = lanes.get(KEY_IDS_KEY)
        recorded = _parsed(stored)
        differ = [] if recorded is None else _differing(recorded, ours)
        if differ:
            return differ
        wanted = ours if recorded is None else _completed(recorded, ours)
        if wanted == recorded or not record:
            return []
        try:
            with lanes.batch(sync=True) as batch:
                batch.expect(KEY_IDS_KEY, stored)
                batch.put(KEY_IDS_KEY, canonical_json(wanted.model_dump()))
            return []
        except ExpectationFailed:
            continue
    raise ExpectationFailed("the store's key ids kept changing while they were recorded")


def _differing(recorded: DeploymentKeyIds, ours: DeploymentKeyIds) -> list[str]:
    differ = []
    if recorded.digest_key is not None and recorded.digest_key != ours.digest_key:
        differ.append("digest_key")
    if recorded.checkpoint_key is not None and recorded.checkpoint_key != ours.checkpoint_key:
        differ.append("checkpoint_key")
    return differ


def _completed(recorded: DeploymentKeyIds, ours: DeploymentKeyIds) -> DeploymentKeyIds:
    """What the store lacks of ours added (a checkpoint key made since), nothing replaced."""
    return DeploymentKeyIds(
        digest_key=recorded.digest_key or ours.digest_key,
        checkpoint_key=recorded.checkpoint_key or ours.checkpoint_key,
    )
