"""`sessionstate decisions`: review the decision log of a stopped service's data dir (or of a
PostgreSQL store while the service runs): verify, export, tail, checkpoint, bundle, prune,
and the Merkle tree's verifier key and proofs (log-key, prove, consistency)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import BaseModel

from service.cli.arguments import positive
from service.cli.store_access import review_lanes
from service.config.log_witnesses import log_witnesses
from service.config.secret_values import secrets_home
from service.config.settings import Settings
from service.config.store import configured_store
from service.decisions import log_review, revisions
from service.decisions import review as decision_review
from service.decisions.evidence_bundle import BundleTree
from service.decisions.shipped_verifier import shipped_verifier
from store.backends.contract import Lanes
from store.canonical import canonical_json
from store.chain.keys import chain_name, chain_names

NAME = "decisions"


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    decisions = commands.add_parser(
        "decisions", help="review the decision log of a stopped service's data dir"
    )
    review = decisions.add_subparsers(dest="review", required=True)
    verify = review.add_parser(
        "verify", help="verify a tenant's hash chain (or every one); exit 1 on any break"
    )
    verify.add_argument(
        "--tenant",
        help="this tenant's chain (~system: the policy activations'; else the checkpoint's, "
        "or the only tenant's)",
    )
    verify.add_argument(
        "--all-tenants",
        action="store_true",
        help="every chain, the no-tenant one and the ~system one (policy activations) included",
    )
    verify.add_argument("--checkpoint", type=Path, help="a signed checkpoint kept earlier")
    verify.add_argument(
        "--public-key", type=Path, help="the checkpoint key's PEM, kept apart (else the data dir's)"
    )
    review.add_parser("public-key", help="print the checkpoint key's PEM, to pin and keep apart")
    review.add_parser(
        "verifier",
        help="print the evidence bundles' verify.py (standard library only), to run on a "
        "bundle instead of the one it ships",
    )
    export = review.add_parser("export", help="NDJSON in OPA's decision log field names")
    export.add_argument("--tenant", help="only this tenant's entries")
    revisions_parser = review.add_parser(
        "revisions",
        help="which policy revisions decided, by tenant: first and last decision, counts by "
        "action, as JSON",
    )
    revisions_parser.add_argument("--tenant", help="only this tenant's")
    tail = review.add_parser("tail", help="the newest entries, one JSON a line")
    tail.add_argument("-n", type=positive, default=10, help="how many (default 10)")
    signing = review.add_parser(
        "checkpoint", help="verify the chain, then print a signed checkpoint of its head, to keep"
    )
    signing.add_argument("--tenant", help="this tenant's chain (else the only one there is)")
    bundle = review.add_parser(
        "bundle",
        help="pack entries, a signed checkpoint and a verifier into a .tar.gz anyone can check",
    )
    bundle.add_argument("--out", type=Path, required=True, help="the .tar.gz to write")
    bundle.add_argument("--tenant", help="only this tenant's entries (else every tenant's)")
    bundle.add_argument("--since", help="evaluated at or after this RFC 3339 time (with a zone)")
    bundle.add_argument("--until", help="evaluated before this RFC 3339 time (with a zone)")
    loss = review.add_parser(
        "record-loss",
        help="record, as an entry, which entries of a tenant's chain are gone under the head the "
        "service signed for it, so the service takes that tenant's decisions again; print the "
        "entry (docs/operators.md: a cut decision log)",
    )
    loss.add_argument(
        "--tenant",
        required=True,
        help="the tenant whose chain is cut (~no-tenant: no tenant's; ~system: the policy "
        "activations')",
    )
    review.add_parser(
        "log-key",
        help="print the checkpoint notes' verifier key (Go's sumdb/note form), to pin and keep",
    )
    prove = review.add_parser(
        "prove",
        help="print a decision's Merkle inclusion proof as JSON, as GET "
        "/v1/decisions/{decision_id}/inclusion answers it",
    )
    prove.add_argument("decision_id")
    prove.add_argument("--tenant", help="the decision's tenant (else the only chain there is)")
    prove.add_argument(
        "--tree-size", type=positive, help="the tree to prove it in (default: the latest note's)"
    )
    consistency = review.add_parser(
        "consistency",
        help="print the Merkle consistency proof between two tree sizes as JSON, as GET "
        "/v1/decisions/consistency answers it",
    )
    consistency.add_argument("--tenant", help="this tenant's tree (else the only chain there is)")
    consistency.add_argument("--first", type=positive, required=True)
    consistency.add_argument("--second", type=positive, required=True)
    prune = review.add_parser(
        "prune", help="delete entries older than N days, keep the rest verifiable"
    )
    prune.add_argument("--older-than-days", type=positive, required=True)


def run(settings: Settings, args: argparse.Namespace) -> int:
    data_dir, secrets = settings.data_dir, secrets_home(settings)
    if args.review == "revisions":
        return _revisions(settings, args.tenant)
    if args.review == "verify":
        if args.all_tenants:
            with review_lanes(settings) as lanes:
                verifier = decision_review.anchor_verifier(secrets, args.public_key)
                every = decision_review.every_chain_verified(lanes, verifier)
            print(every.model_dump_json())
            return 0 if every.ok else 1
        result = decision_review.verify(
            data_dir, secrets, args.checkpoint, args.public_key, args.tenant
        )
        print(result.model_dump_json())
        return 0 if result.ok else 1
    if args.review in ("log-key", "prove", "consistency"):
        return _log_proofs(settings, args)
    if args.review == "public-key":
        print(decision_review.public_key(secrets).decode("ascii"), end="")
    elif args.review == "verifier":
        sys.stdout.flush()
        sys.stdout.buffer.write(shipped_verifier())  # byte for byte what bundles ship
    elif args.review == "checkpoint":
        print(decision_review.checkpoint(data_dir, secrets, args.tenant).model_dump_json())
    elif args.review == "bundle":
        tree = BundleTree(settings.log_origin, log_witnesses(settings))
        made = decision_review.bundle(
            data_dir, secrets, args.out, args.tenant, args.since, args.until, tree
        )
        print(
            json.dumps(
                {
                    "out": str(args.out),
                    "entries": made.entries,
                    "checkpoint": made.checkpoint.model_dump(),
                }
            )
        )
    elif args.review == "export":
        for line in decision_review.export_lines(data_dir, args.tenant):
            print(line)
    elif args.review == "tail":
        for entry in decision_review.tail(data_dir, args.n):
            print(canonical_json(entry).decode("utf-8"))  # the stored form: RFC 8785
    elif args.review == "record-loss":
        with review_lanes(settings) as lanes:
            entry = decision_review.record_loss(lanes, secrets, args.tenant)
        print(canonical_json(entry).decode())
    elif args.review == "prune":
        print(
            json.dumps({"pruned": decision_review.prune(data_dir, secrets, args.older_than_days)})
        )
    return 0


def _log_proofs(settings: Settings, args: argparse.Namespace) -> int:
    """`decisions log-key`, `prove`, `consistency`: what the proof routes answer."""
    if args.review == "log-key":
        if configured_store(settings).capabilities.shared:  # read while the service runs
            with review_lanes(settings):  # the key the store recorded, or a refusal
                pass
        print(log_review.log_key(settings))
        return 0
    with review_lanes(settings) as lanes:
        if args.review == "prove":
            proof: BaseModel = log_review.prove(
                lanes, settings, args.decision_id, args.tenant, args.tree_size
            )
        else:
            proof = log_review.prove_consistency(
                lanes, settings, args.first, args.second, args.tenant
            )
    print(proof.model_dump_json())
    return 0


def _revisions(settings: Settings, tenant: str | None) -> int:
    """`decisions revisions`: the summaries the journal keeps, by chain (tenant)."""
    with review_lanes(settings) as lanes:
        print(_revision_listing(lanes, tenant))
    return 0


def _revision_listing(lanes: Lanes, tenant: str | None) -> str:
    chains = chain_names(lanes) if tenant is None else [chain_name(tenant)]
    listing = {
        name: [summary.model_dump() for summary in revisions.revisions(lanes, name)]
        for name in chains
    }
    return json.dumps({"complete": revisions.complete(lanes), "tenants": listing})
