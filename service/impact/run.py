"""One impact run: check the candidate, serve it, ask it every selected logged decision."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path

from service.config.store import StoreTarget
from service.decisions.evidence_bundle import BundleSelection
from service.impact import candidate, logged
from service.impact.candidate import CandidateEngine
from service.impact.compare import ImpactTally, LoggedDecision, skip_reason
from service.impact.report import ImpactReport

CHUNK = 2000  # decisions asked at once: bounds memory, keeps every connection busy


def analyse(
    opa_bin: str,
    candidate_dir: Path,
    live_policy_dir: Path,
    source: StoreTarget | Path,
    selection: BundleSelection,
    examples: int,
) -> ImpactReport:
    """The impact report of the candidate over the decisions of a store or an export file.

    The candidate is checked before anything is read (`CandidateBroken`), and the
    source opened before OPA starts, so a bad source fails fast."""
    candidate.check(opa_bin, candidate_dir, live_policy_dir)
    decisions = (
        logged.exported(source, selection)
        if isinstance(source, Path)
        else logged.stored(source, selection)
    )
    with closing(decisions):
        first = next(decisions, None)  # opens the source: a bad one fails before OPA starts
        with candidate.served(opa_bin, candidate_dir) as engine:
            head = [] if first is None else [first]
            return compare_all(engine, itertools.chain(head, decisions), examples)


def compare_all(
    engine: CandidateEngine, decisions: Iterable[LoggedDecision], examples: int
) -> ImpactReport:
    tally = ImpactTally(engine.revision, examples)
    batch: list[LoggedDecision] = []

    def flush() -> None:
        for decision, after in zip(batch, engine.decide(batch), strict=True):
            tally.compare(decision, after)
        batch.clear()

    for decision in decisions:
        why = skip_reason(decision)
        if why is not None:
            tally.skip(why)
            continue
        batch.append(decision)
        if len(batch) >= CHUNK:
            flush()
    flush()
    return tally.report()
