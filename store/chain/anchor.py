"""The retention anchor as stored: where a chain starts once retention pruned its oldest entries.

Retention deletes the oldest entries and, in the same batch, keeps an anchor (the
last deleted entry's seq and hash) in the `trace_meta` lane, so what remains is
still provable. The anchor is signed with the checkpoint key
(`store.chain.checkpoints.RetentionAnchor`, naming its chain), and every verify checks
that signature with the verifier it is given: whoever can write the store but
not read the key cannot delete the oldest entries and pass the rest off as
retention's. Anchors older releases wrote unsigned fail verify
(`anchor_unsigned`) until `sessionstate db upgrade` signs them; the legacy
global chain's anchor predates signing, and is read as it is only to migrate it.
"""

from __future__ import annotations

from contextlib import suppress

from store.backends.contract import Lanes
from store.chain.checkpoints import CheckpointVerifier, RetentionAnchor
from store.chain.head import GENESIS, ChainHead
from store.chain.keys import LEGACY_CHAIN, anchor_key
from store.chain.walk import ChainProblem

# A stored anchor as read: signed, or a bare head (genesis when none is stored, else an
# unsigned one older releases wrote).
Anchor = RetentionAnchor | ChainHead


def read_anchor(lanes: Lanes, chain: str) -> Anchor | None:
    """The stored anchor of chain: signed, or bare (older releases'); genesis when none is
    stored, None when it does not read. Its signature is not checked here."""
    stored = lanes.get(anchor_key(chain))
    if stored is None:
        return GENESIS
    return _parse_anchor(stored)


def start_of(anchor: Anchor) -> ChainHead:
    """The head a walk from anchor starts at."""
    return anchor.head if isinstance(anchor, RetentionAnchor) else anchor


def anchor_problem(
    anchor: Anchor, chain: str, verifier: CheckpointVerifier | None
) -> ChainProblem | None:
    """Why the stored anchor is not one to walk from: unsigned, or not signed by the key
    for this chain; None for a signed one that holds, genesis, or the legacy chain's."""
    if isinstance(anchor, RetentionAnchor):
        holds = verifier is not None and verifier.verify_anchor(anchor, chain)
        return None if holds else "anchor_signature_invalid"
    if anchor.seq == 0 or chain == LEGACY_CHAIN:  # nothing pruned; or before signing
        return None
    return "anchor_unsigned"


def _parse_anchor(stored: bytes) -> Anchor | None:
    """A stored anchor's document, signed or bare; None when it is neither, or at seq 0."""
    anchor: Anchor | None = None
    for model in (RetentionAnchor, ChainHead):
        with suppress(ValueError):  # never re-raised: validation errors quote their input
            anchor = model.model_validate_json(stored)
            break
    return anchor if anchor is not None and anchor.seq > 0 else None
