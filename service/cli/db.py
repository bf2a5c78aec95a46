"""`sessionstate db`: the configured store brought to this release (`upgrade`), or the data
dir's LevelDB repaired (`repair`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.approvals.index import index_approvals, mark_index_complete_if_empty
from service.approvals.lookup import ApprovalStore
from service.cli.store_access import holding_data_dir
from service.config.configuration_error import ConfigurationError
from service.config.key_ids import hold_key_ids
from service.config.secret_values import secrets_home
from service.config.settings import Settings
from service.config.store import VARIABLE, StoreTarget, configured_store
from service.decisions import review as decision_review
from service.decisions import revisions
from service.decisions.migration import migrate, sign_unsigned_anchors
from store.backends.contract import Lanes, StoreOffline
from store.backends.registry import backend
from store.chain.head import format_timestamp
from store.chain.keys import chain_names
from store.chain.tree_build import TreeBuild, build_tree
from store.deployment_keys import recorded_key_ids
from store.embedded.repair import repair
from store.secrets import SecretsHome
from store.session_dating import date_undated_sessions

NAME = "db"


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    database = commands.add_parser("db", help="the configured store: upgrade it, repair LevelDB")
    repairs = database.add_subparsers(dest="db", required=True)
    repairs.add_parser(
        "upgrade",
        help="bring the configured store (SESSIONSTATE_STORE, else the data dir's LevelDB) to "
        "this release's schema and record its version; move a decision log written as one "
        "global chain onto per-tenant chains (it must verify first); index approvals stored "
        "before the approval index; date records stored before idle expiry, as written now; "
        "build the Merkle tree of chains written before trees (trees_built; a chain pruned "
        "before it had one is listed in trees_unbuildable); print what it did as JSON; safe to "
        "run again",
    )
    repairs.add_parser(
        "repair",
        help="run LevelDB's repairer, report what it dropped as JSON, verify the decision chain; "
        "exit 1 unless the store then opens and the chain verifies",
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.db == "upgrade":
        return _upgrade(settings)
    return _repair(settings)


def _upgrade(settings: Settings) -> int:
    """`db upgrade`: the configured store brought to this release's schema, a decision log
    still kept as one global chain moved onto per-tenant chains, and retention anchors
    signed; exit 1 if a chain did not verify from its unsigned anchor (left unsigned)."""
    store = configured_store(settings)
    done = _upgrade_schema(store)
    steps: dict[str, Any] = {}
    if store.present:  # PostgreSQL: written by a preview before chains were per tenant?
        with _upgrading_lanes(settings, store) as lanes:
            hold_key_ids(lanes, settings)  # before anything is signed with them
            steps = {
                **_upgrade_lanes(lanes, secrets_home(settings)),
                "key_ids": recorded_key_ids(lanes),  # as the store records them now
            }
    did = {
        "chains_migrated": None,
        "approvals_indexed": None,
        "revisions_summarised": None,
        "sessions_dated": None,
        "trees_built": None,
        "key_ids": None,
        "anchors_signed": {},
        "anchors_unverified": {},
        **steps,
    }
    unbuildable = did.pop("trees_unbuildable", [])  # said every run: not a change
    key_ids = did.pop("key_ids")  # said every run, as the store records them: not a change
    changed = done.changed or any(value not in (None, {}) for value in did.values())
    print(
        json.dumps(
            {
                "store": done.store,
                "target": done.target,
                "found": done.found,
                "now": done.now,
                "changed": changed,
                **did,
                "trees_unbuildable": unbuildable,
                "key_ids": None if key_ids is None else key_ids.model_dump(),
            }
        )
    )
    return 1 if did["anchors_unverified"] else 0


@dataclass(frozen=True)
class StoreUpgrade:
    """What the schema upgrade did, as `sessionstate db upgrade` prints it."""

    store: str
    target: str
    found: int | None
    now: int | None

    @property
    def changed(self) -> bool:
        return self.found != self.now


def _upgrade_schema(store: StoreTarget) -> StoreUpgrade:
    """Bring the configured store's schema to this code's version: PostgreSQL creates or
    upgrades its tables and records the version; LevelDB has no schema yet (`None`)."""
    try:
        done = backend(store.kind).upgrade(store.location)
    except StoreOffline as error:
        raise StoreOffline(f"{error} ({VARIABLE})") from None
    return StoreUpgrade(store.kind, store.target, done.found, done.now)


def _upgrade_lanes(lanes: Lanes, secrets: SecretsHome) -> dict[str, Any]:
    """Move an old global chain onto per-tenant chains, index approvals stored before the
    approval index existed, summarise the policy revisions of decisions logged before the
    summaries existed, date records stored before sessions had a meta key, so that idle
    expiry sees them, build the Merkle tree of every chain written before trees, from its
    entries (`store.chain.tree_build`: the chains built; None for each when there was
    nothing to do), and sign retention anchors older releases left unsigned: by chain, the
    anchor's seq, or the problem of a chain that did not verify from it. A chain retention
    pruned before it had a tree cannot get one (the leaves of its pruned entries are gone):
    it is listed in `trees_unbuildable` at every run, and its proofs and checkpoint notes are
    refused (`decision_log_tree_unavailable`); its hash chain works as before."""
    now = datetime.now(UTC)
    migration = migrate(lanes, now)
    indexed = None
    if not (mark_index_complete_if_empty(lanes) or ApprovalStore(lanes).index_complete()):
        indexed = index_approvals(lanes, now)
    summarised = None if revisions.complete(lanes) else revisions.rebuild(lanes)
    walks = sign_unsigned_anchors(lanes, secrets, now)
    dated = date_undated_sessions(lanes, format_timestamp(now))
    trees = {name: build_tree(lanes, name) for name in chain_names(lanes)}
    built = [name for name, build in trees.items() if build is TreeBuild.BUILT]
    return {
        "chains_migrated": None if migration is None else migration.model_dump(mode="json"),
        "approvals_indexed": indexed,
        "revisions_summarised": summarised,
        "sessions_dated": dated,
        "trees_built": built or None,
        "trees_unbuildable": [
            name for name, build in trees.items() if build is TreeBuild.UNBUILDABLE
        ],
        "anchors_signed": {
            name: walk.anchor.seq for name, walk in walks.items() if walk.anchor is not None
        },
        "anchors_unverified": {
            name: {"problem": walk.problem, "first_invalid_seq": walk.first_invalid_seq}
            for name, walk in walks.items()
            if not walk.ok
        },
    }


@contextmanager
def _upgrading_lanes(settings: Settings, store: StoreTarget) -> Iterator[Lanes]:
    """The store to upgrade, opened for review; one that admits one process only (LevelDB)
    under the service's own lock on the data dir as well."""
    with ExitStack() as held:
        if not store.capabilities.shared:
            held.enter_context(holding_data_dir(settings.data_dir, Path(store.target)))
        yield held.enter_context(decision_review.open_store(store, settings.data_dir))


def _repair(settings: Settings) -> int:
    store = configured_store(settings)
    if not store.capabilities.repair:
        raise ConfigurationError(
            "`db repair` repairs the data dir's LevelDB; SESSIONSTATE_STORE names a "
            "PostgreSQL database, which PostgreSQL's own tools look after"
        )
    data_dir = settings.data_dir
    database = Path(store.location)
    if not store.present:
        raise FileNotFoundError(f"no sessionstate database under {data_dir}")
    with holding_data_dir(data_dir, database):
        report = repair(database, decision_review.anchor_verifier(secrets_home(settings)))
    print(report.model_dump_json())
    return 0 if report.ok else 1
