"""The offline twins of the Merkle proof routes: `sessionstate decisions log-key`, `prove` and
`consistency`, on the configured store (the data dir's LevelDB with the service stopped, or
PostgreSQL while it runs).

They answer exactly what `GET /v1/decisions/log-key`, `.../{decision_id}/inclusion` and
`.../consistency` answer, through the same code: the latest note is the one the chain's walk
verifies to now (signed and kept when it grew, by `store.chain.log_note`), and proofs are
bounded by its size. Refusals are `ReviewError`s naming the reason code the routes use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from service.api.reasons import Reason
from service.api.wire import ConsistencyProofResponse, InclusionProofResponse
from service.config.secret_values import secrets_home
from service.config.settings import Settings
from service.decisions.reader import DecisionLogReader
from service.decisions.review import ReviewError, only_chain
from store.backends.contract import Lanes
from store.chain.evidence import EvidenceChain
from store.chain.keys import entry_key
from store.chain.log_note import LogSigner, TreeUnavailable, current_note
from store.chain.log_proofs import ProofOutOfRange, ProofPruned, consistency, inclusion
from store.chain.signed_head import ChainUnverified


def log_signer(settings: Settings) -> LogSigner:
    return LogSigner.of(secrets_home(settings), settings.log_origin)


def log_key(settings: Settings) -> str:
    """The checkpoint notes' verifier key (`<name>+<hex id>+<base64 key>`)."""
    return str(log_signer(settings).verifier_key)


@contextmanager
def _refusals() -> Iterator[None]:
    """The tree's refusals as review errors that say the routes' reason code."""
    try:
        yield
    except ChainUnverified:
        raise  # names its problem already
    except TreeUnavailable as error:
        raise ReviewError(f"{Reason.DECISION_LOG_TREE_UNAVAILABLE}: {error}") from None
    except ProofOutOfRange as error:
        raise ReviewError(f"{Reason.PROOF_OUT_OF_RANGE}: {error}") from None
    except ProofPruned as error:
        raise ReviewError(f"{Reason.PROOF_PRUNED}: {error}") from None


def _latest_size(chain: EvidenceChain, settings: Settings) -> int:
    note = current_note(chain, secrets_home(settings), log_signer(settings), datetime.now(UTC))
    return note.head.size


def prove(
    lanes: Lanes,
    settings: Settings,
    decision_id: str,
    tenant: str | None = None,
    tree_size: int | None = None,
) -> InclusionProofResponse:
    """The inclusion proof of a decision of a tenant's chain (else the only chain's)."""
    name = tenant or only_chain(lanes)
    found = DecisionLogReader(lanes).get(name, decision_id)
    stored = None if found is None else lanes.get(entry_key(found.entry.seq, name))
    if found is None or stored is None:
        raise ReviewError(f"{Reason.DECISION_NOT_FOUND}: no such decision on that chain")
    chain = EvidenceChain(lanes, name)
    with _refusals():
        latest = _latest_size(chain, settings)
        size = latest if tree_size is None else tree_size
        return InclusionProofResponse.of(inclusion(chain, found.entry.seq, stored, size, latest))


def prove_consistency(
    lanes: Lanes, settings: Settings, first: int, second: int, tenant: str | None = None
) -> ConsistencyProofResponse:
    """The consistency proof between two sizes of a tenant's tree (else the only chain's)."""
    chain = EvidenceChain(lanes, tenant or only_chain(lanes))
    with _refusals():
        latest = _latest_size(chain, settings)
        return ConsistencyProofResponse.of(consistency(chain, first, second, latest))
