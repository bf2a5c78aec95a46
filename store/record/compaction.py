"""Compaction: a long session's oldest turns move into a summary anyone holding them can check.

A record keeps at most a window of turns. A write whose turns overflow it
keeps the newest and folds the oldest, in order, into `compacted_turns`,
extending the summary of the stored version the write is based on. The
summary digest is a hash chain over the folded turns:

    d0      = "sha256:" + 64 zeros
    d(i+1)  = "sha256:" + hex(SHA-256(UTF-8(d(i) "\\n" turn_id "\\n" role "\\n" payload_digest)))

None of the three fields can hold a newline (identifiers, a role, a digest),
so the bytes hashed name one turn unambiguously. The turn id and the role are
in it so that relabelling turns, or swapping the roles of two turns whose
text (and so whose keyed payload digest) is the same, changes the digest
too, not only a gap or a reordering.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from store.record.bounds import MAX_SAFE_INTEGER
from store.record.state_record import CompactedTurns, SessionTurnDigest


def chain_step(previous: str, turn: SessionTurnDigest) -> str:
    """The summary digest after `previous` takes one more compacted turn."""
    line = "\n".join((previous, turn.turn_id, turn.role, turn.payload_digest))
    return "sha256:" + hashlib.sha256(line.encode("utf-8")).hexdigest()


def extend(summary: CompactedTurns, turns: Sequence[SessionTurnDigest]) -> CompactedTurns:
    """summary with turns folded in, in order. The token estimate saturates, never fails."""
    if not turns:
        return summary
    digest = summary.digest
    for turn in turns:
        digest = chain_step(digest, turn)
    return CompactedTurns(
        count=summary.count + len(turns),
        token_estimate=min(
            MAX_SAFE_INTEGER, summary.token_estimate + sum(turn.token_estimate for turn in turns)
        ),
        digest=digest,
    )


def compact(
    summary: CompactedTurns, turns: Sequence[SessionTurnDigest], keep: int
) -> tuple[CompactedTurns, list[SessionTurnDigest]]:
    """The newest `keep` turns, and summary extended with the older ones."""
    if keep < 1:
        raise ValueError("a record keeps at least one turn")
    overflow = max(0, len(turns) - keep)
    return extend(summary, turns[:overflow]), list(turns[overflow:])
