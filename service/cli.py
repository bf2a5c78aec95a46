"""The `sessionstate` command: serve, reload policies, mint tokens, review the decision log,
export the secrets, repair the store."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jwt
from pydantic import ValidationError

from service.approvals.index import index_approvals, mark_index_complete_if_empty
from service.approvals.lookup import ApprovalStore
from service.auth.tokens import mint_token
from service.config.configuration_error import ConfigurationError
from service.config.secret_values import jwt_secret, secret_lines
from service.config.settings import Settings, setting_errors, unknown_variables
from service.config.store import StoreTarget, configured_store
from service.decisions import review as decision_review
from service.decisions import revisions
from service.decisions.bundle import VERIFIER
from service.decisions.migration import LegacyChainUnverified, migrate, sign_unsigned_anchors
from service.decisions.review import ReviewError
from service.impact.candidate import CandidateUnavailable
from service.impact.report import render
from service.impact.run import analyse
from service.policy.coverage_gate import CoverageGate
from service.policy.engine_checks import local_opa_bin
from service.policy.reload import LOCK_FILE, REVISION_PATTERN, PolicyStatus, request_reload
from service.policy.sidecar import SidecarError
from service.policy.signed_bundle import SIGNING_ALGS, build_signed_bundle
from service.policy.source import PolicyRefused, PolicyTestsFailed
from service.store_backend import upgrade as upgrade_store
from service.walkthrough import walkthrough
from store.backends.contract import Lanes, StoreOffline, StoreUpgradeRefused
from store.backends.postgres_schema import SchemaMismatch
from store.canonical import canonical_json
from store.chain.entry import ChainCorrupt
from store.chain.keys import chain_name, chain_names
from store.integrity import StoreBusy, StoreUnavailable
from store.repair import repair
from store.scope import is_scope_id
from store.signed_head import ChainUnverified

ROLES = ("model-service", "operator", "auditor")
DEFAULT_TOKEN_TTL = 3600
RELOAD_TOKEN_TTL = 120  # `policy reload --operator`: lives as long as a reload takes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sessionstate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="start the OPA sidecar and the service")
    serve.add_argument(
        "--walkthrough", action="store_true", help="print a ready-to-paste walk-through once up"
    )
    serve.add_argument(
        "--watch-policies",
        action="store_true",
        help="serve every edit of the policy directory that compiles, without a reload "
        "(as SESSIONSTATE_WATCH_POLICIES=true); for policy development only",
    )
    serve.add_argument(
        "--workers",
        type=_positive,
        help="HTTP worker processes (as SESSIONSTATE_WORKERS; default 1); above 1 needs "
        "SESSIONSTATE_STORE (PostgreSQL): LevelDB admits one process",
    )

    policy = commands.add_parser("policy", help="the policies the running service decides with")
    policy_commands = policy.add_subparsers(dest="policy", required=True)
    reload = policy_commands.add_parser(
        "reload",
        help="make the running service of the data dir serve the policy directory as it is now, "
        "if it compiles and passes its tests (as SIGHUP does); print the outcome as JSON; exit 1 "
        "unless OPA then decides with it, 3 when it waits for approvals "
        "(SESSIONSTATE_POLICY_ACTIVATION_APPROVALS)",
    )
    reload.add_argument(
        "--timeout", type=_positive, default=30, help="seconds to wait for the outcome (30)"
    )
    reload.add_argument(
        "--skip-tests",
        action="store_true",
        help="serve it even if its tests fail or cover it below SESSIONSTATE_POLICY_COVERAGE_MIN "
        "(this reload only; logged as policy_tests_skipped with the operator); needs --operator "
        "or --token-file",
    )
    who = reload.add_mutually_exclusive_group()
    who.add_argument(
        "--operator",
        type=_operator,
        help="who reloads, on the decision log: a short-lived operator token for this id (letters, "
        "digits, '.', '_', '-') is minted with the data dir's HS256 secret (as `sessionstate "
        "token` does)",
    )
    who.add_argument(
        "--token-file",
        type=Path,
        help="who reloads, on the decision log: a file holding your operator bearer token "
        "(your identity provider's, say), which the service verifies",
    )
    _add_policy_approve(policy_commands)
    _add_policy_build(policy_commands)
    impact = policy_commands.add_parser(
        "impact",
        help="what a candidate policy directory would have decided on the logged decisions "
        "(the configured store, read-only, or an export); exit 3 when --fail-on holds",
    )
    impact.add_argument("candidate", type=Path, help="the candidate policy directory")
    impact.add_argument(
        "--decisions",
        type=Path,
        help="an NDJSON export (`decisions export`, GET /v1/decisions/export) instead of the store",
    )
    impact.add_argument("--since", help="evaluated at or after this RFC 3339 time (with a zone)")
    impact.add_argument("--until", help="evaluated before this RFC 3339 time (with a zone)")
    impact.add_argument("--tenant", help="only this tenant's decisions")
    impact.add_argument("--action", help="only decisions of this action (e.g. write)")
    impact.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    impact.add_argument(
        "--fail-on",
        choices=("none", "any", "allow-gained", "allow-lost"),
        default="none",
        help="exit 3 when any decision changed, or gained or lost allow (default none)",
    )
    impact.add_argument(
        "--examples", type=_not_negative, default=10, help="changed decisions shown (default 10)"
    )

    token = commands.add_parser("token", help="mint a bearer token with the local HS256 secret")
    token.add_argument("--sub", required=True, help="the actor id")
    token.add_argument("--role", action="append", required=True, choices=ROLES, dest="roles")
    token.add_argument("--tenant")
    token.add_argument("--workspace")
    token.add_argument("--session")
    token.add_argument(
        "--ttl",
        type=int,
        help="seconds (default 3600, or SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS when lower)",
    )

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
    tail.add_argument("-n", type=_positive, default=10, help="how many (default 10)")
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
    prune = review.add_parser(
        "prune", help="delete entries older than N days, keep the rest verifiable"
    )
    prune.add_argument("--older-than-days", type=_positive, required=True)

    secrets = commands.add_parser(
        "secrets", help="the JWT secret and digest key, to move a data dir to compose"
    )
    secret_commands = secrets.add_subparsers(dest="secrets", required=True)
    secret_commands.add_parser(
        "export",
        help="print the secrets themselves, as env lines for compose",
        description="Prints SESSIONSTATE_JWT_SECRET=hex:… and SESSIONSTATE_DIGEST_KEY=hex:… "
        "lines: the secrets themselves, on stdout. That is its purpose; nothing is logged. "
        "They are the data dir's secrets, or those variables' when set. Redirect them into an "
        "env file that only its owner can read (umask 077); tokens and digests stay valid "
        "when a service reads them from there.",
    )

    database = commands.add_parser("db", help="the configured store: upgrade it, repair LevelDB")
    repairs = database.add_subparsers(dest="db", required=True)
    repairs.add_parser(
        "upgrade",
        help="bring the configured store (SESSIONSTATE_STORE, else the data dir's LevelDB) to "
        "this release's schema and record its version; move a decision log written as one "
        "global chain onto per-tenant chains (it must verify first); index approvals stored "
        "before the approval index; print what it did as JSON; safe to run again",
    )
    repairs.add_parser(
        "repair",
        help="run LevelDB's repairer, report what it dropped as JSON, verify the decision chain; "
        "exit 1 unless the store then opens and the chain verifies",
    )

    args = parser.parse_args(argv)
    try:
        settings = _settings()
        if args.command == "token":
            longest = settings.jwt_max_lifetime_seconds
            ttl = min(DEFAULT_TOKEN_TTL, longest) if args.ttl is None else args.ttl
            if ttl > longest:
                print(
                    f"sessionstate: --ttl {ttl} is over SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS "
                    f"({longest}); the service would refuse that token",
                    file=sys.stderr,
                )
                return 2
            print(
                mint_token(
                    jwt_secret(settings),
                    sub=args.sub,
                    roles=args.roles,
                    tenant=args.tenant,
                    workspace=args.workspace,
                    session=args.session,
                    ttl_seconds=ttl,
                )
            )
            return 0
        if args.command == "decisions":
            return _review(settings, args)
        if args.command == "db" and args.db == "upgrade":
            return _upgrade(settings)
        if args.command == "db":
            return _repair(settings)
        if args.command == "secrets":
            for line in secret_lines(settings):
                print(line)
            return 0
        if args.command == "policy" and args.policy == "build":
            return _policy_build(settings, args)
        if args.command == "policy" and args.policy == "impact":
            return _impact(settings, args)
        if args.command == "policy" and args.policy == "approve":
            approving = _operator_token(settings, args.operator, args.token_file)
            status = request_reload(
                settings.data_dir, args.timeout, approving, approve=args.revision
            )
            print(status.model_dump_json())
            return _reload_exit(status)
        if args.command == "policy":
            operator_token = _operator_token(settings, args.operator, args.token_file)
            if args.skip_tests and operator_token is None:
                reload.error("--skip-tests needs --operator or --token-file")
            skips = _named_operator(args.operator, operator_token) if args.skip_tests else None
            status = request_reload(
                settings.data_dir, args.timeout, operator_token, skip_tests_by=skips
            )
            print(status.model_dump_json())
            return _reload_exit(status)
        from service.runtime.process import serve as run_service

        if args.watch_policies:
            settings = settings.model_copy(update={"watch_policies": True})
        if args.workers is not None:
            settings = settings.model_copy(update={"workers": args.workers})
        run_service(
            settings,
            on_ready=(lambda: print(walkthrough(settings), flush=True))
            if args.walkthrough
            else None,
        )
        return 0
    except (
        ConfigurationError,
        SidecarError,
        ReviewError,
        StoreUnavailable,
        StoreOffline,
        SchemaMismatch,
        StoreUpgradeRefused,
        CandidateUnavailable,
        ValueError,
        OSError,
    ) as error:
        print(f"sessionstate: {error}", file=sys.stderr)
        return 2
    except (ChainUnverified, LegacyChainUnverified) as error:
        print(f"sessionstate: {error}", file=sys.stderr)
        return 1
    except ChainCorrupt as error:  # its messages are fixed: they never quote stored bytes
        print(
            f"sessionstate: the decision log cannot be extended or pruned ({error}); "
            "run `sessionstate decisions verify` to find the first problem",
            file=sys.stderr,
        )
        return 1


def _settings() -> Settings:
    """The settings from the environment; a bad one is named with its rule and the values it
    accepts, never its value. A `SESSIONSTATE_*` name that is no setting is warned about."""
    for name, closest in unknown_variables(os.environ):
        hint = f"; did you mean {closest}?" if closest else ""
        print(
            f"sessionstate: warning: {name} is not a setting and is ignored{hint}",
            file=sys.stderr,
        )
    try:
        return Settings()
    except ValidationError as error:
        raise ConfigurationError(f"invalid setting: {setting_errors(error)}") from None


def _operator_token(
    settings: Settings, operator: str | None, token_file: Path | None
) -> str | None:
    """The token that names who reloads: minted for `operator`, or read from `token_file`."""
    if operator is not None:
        ttl = min(RELOAD_TOKEN_TTL, settings.jwt_max_lifetime_seconds)
        return mint_token(jwt_secret(settings), sub=operator, roles=["operator"], ttl_seconds=ttl)
    if token_file is None:
        return None
    token = token_file.read_text().strip()
    if token.startswith("Bearer "):
        token = token.removeprefix("Bearer ").strip()
    return token


def _reload_exit(status: PolicyStatus) -> int:
    """0: OPA decides with what the directory (or the approval) made live; 3: a new revision
    waits for approvals; 1: refused, or OPA does not decide with it."""
    if status.outcome == "awaiting_approval":
        return 3
    loaded = status.source_valid and status.deciding and status.outcome != "refused"
    return 0 if loaded else 1


def _add_policy_approve(
    policy_commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """`policy approve`: a second operator's approval of the revision that waits."""
    approve = policy_commands.add_parser(
        "approve",
        help="approve the policy revision that waits in the running service of the data dir "
        "(SESSIONSTATE_POLICY_ACTIVATION_APPROVALS above 1), as the operator your token names; "
        "the sessionstate.approval policy decides, on the decision log; print the outcome as "
        "JSON; exit 0 once OPA decides with it, 3 while it waits for more approvals, 1 when "
        "refused",
    )
    approve.add_argument(
        "revision", type=_revision, help="the revision (`pending_revision` of the reload)"
    )
    approve.add_argument(
        "--timeout", type=_positive, default=30, help="seconds to wait for the outcome (30)"
    )
    who = approve.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--operator",
        type=_operator,
        help="who approves: a short-lived operator token for this id is minted with the data "
        "dir's HS256 secret (as `sessionstate token` does)",
    )
    who.add_argument(
        "--token-file",
        type=Path,
        help="who approves: a file holding your operator bearer token, which the service verifies",
    )


def _revision(value: str) -> str:
    if re.fullmatch(REVISION_PATTERN, value) is None:
        raise argparse.ArgumentTypeError("not a policy revision (letters, digits, ':._-')")
    return value


def _named_operator(operator: str | None, token: str | None) -> str | None:
    """Who a reload's token names: `--operator`, or the `sub` of the token file's token, read
    unverified (the service verifies it, and refuses a reload whose skip names another)."""
    if operator is not None or token is None:
        return operator
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    sub = claims.get("sub")
    return sub if isinstance(sub, str) and is_scope_id(sub) else None


def _add_policy_build(policy_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`policy build`: a signed bundle of the policy directory, for SESSIONSTATE_POLICY_BUNDLE."""
    build = policy_commands.add_parser(
        "build",
        help="check the policy directory (SESSIONSTATE_POLICY_DIR) as a reload would, then build "
        "a bundle of what the sidecar would serve, numbered --serial and signed by OPA (`opa "
        "build --signing-key`); print its revision and serial as JSON",
    )
    build.add_argument(
        "--serial",
        type=_positive,
        required=True,
        help="the bundle's number, signed with it: the service refuses a bundle whose serial is "
        "below the highest it activated (a rollback), or equal to it with other content; give "
        "each new bundle a higher one (a CI build number, say)",
    )
    build.add_argument(
        "--signing-key",
        type=Path,
        required=True,
        help="a PEM private key file (RS256, ES256), or a file holding the HS256 secret",
    )
    build.add_argument("--signing-alg", choices=SIGNING_ALGS, default="RS256", help="(RS256)")
    build.add_argument(
        "--out",
        type=Path,
        default=Path("bundle.tar.gz"),
        help="the bundle to write (bundle.tar.gz)",
    )


def _policy_build(settings: Settings, args: argparse.Namespace) -> int:
    """`policy build`: exit 1, nothing signed, when the admission checks refuse the policies
    or the directory's tests keep it from shipping."""
    opa_bin = local_opa_bin(settings)
    try:
        built = build_signed_bundle(
            opa_bin,
            settings.policy_dir,
            args.signing_key,
            args.signing_alg,
            args.out,
            serial=args.serial,
            tests=CoverageGate(opa_bin, settings.policy_coverage_min),
        )
    except PolicyRefused as refused:
        print(f"sessionstate: {refused}", file=sys.stderr)
        return 1
    except PolicyTestsFailed as error:
        print(f"sessionstate: not signed: {error}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "out": str(built.out),
                "revision": built.revision,
                "serial": built.serial,
                "signing_alg": built.signing_alg,
            }
        )
    )
    return 0


def _operator(text: str) -> str:
    if not is_scope_id(text):
        raise argparse.ArgumentTypeError("must be an id: letters, digits, '.', '_', '-'")
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _not_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _impact(settings: Settings, args: argparse.Namespace) -> int:
    """`policy impact`: the report on stdout; 3 when the --fail-on condition holds."""
    selection = decision_review.selection_of(
        tenant_id=args.tenant, action=args.action, since=args.since, until=args.until
    )
    if args.decisions is not None and not args.decisions.is_file():
        raise ReviewError(f"the export {args.decisions} is not a file")
    report = analyse(
        local_opa_bin(settings),
        args.candidate,
        settings.policy_dir,
        configured_store(settings) if args.decisions is None else args.decisions,
        selection,
        args.examples,
    )
    print(render(report, args.format))
    return 3 if report.fails(args.fail_on) else 0


def _upgrade(settings: Settings) -> int:
    """`db upgrade`: the configured store brought to this release's schema, a decision log
    still kept as one global chain moved onto per-tenant chains, and retention anchors
    signed; exit 1 if a chain did not verify from its unsigned anchor (left unsigned)."""
    store = configured_store(settings)
    done = upgrade_store(store)
    steps: dict[str, Any] = {}
    if store.present:  # PostgreSQL: written by a preview before chains were per tenant?
        with _upgrading_lanes(settings, store) as lanes:
            steps = _upgrade_lanes(lanes, settings.data_dir)
    did = {
        "chains_migrated": None,
        "approvals_indexed": None,
        "revisions_summarised": None,
        "anchors_signed": {},
        "anchors_unverified": {},
        **steps,
    }
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
            }
        )
    )
    return 1 if did["anchors_unverified"] else 0


def _upgrade_lanes(lanes: Lanes, data_dir: Path) -> dict[str, Any]:
    """Move an old global chain onto per-tenant chains, index approvals stored before the
    approval index existed, summarise the policy revisions of decisions logged before the
    summaries existed (None for each when there was nothing to do), and sign retention
    anchors older releases left unsigned: by chain, the anchor's seq, or the problem of a
    chain that did not verify from it."""
    now = datetime.now(UTC)
    migration = migrate(lanes, now)
    indexed = None
    if not (mark_index_complete_if_empty(lanes) or ApprovalStore(lanes).index_complete()):
        indexed = index_approvals(lanes, now)
    summarised = None if revisions.complete(lanes) else revisions.rebuild(lanes)
    walks = sign_unsigned_anchors(lanes, data_dir, now)
    return {
        "chains_migrated": None if migration is None else migration.model_dump(mode="json"),
        "approvals_indexed": indexed,
        "revisions_summarised": summarised,
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
            held.enter_context(_holding_data_dir(settings.data_dir, Path(store.target)))
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
    with _holding_data_dir(data_dir, database):
        report = repair(database, decision_review.anchor_verifier(data_dir))
    print(report.model_dump_json())
    return 0 if report.ok else 1


@contextmanager
def _holding_data_dir(data_dir: Path, database: Path) -> Iterator[None]:
    """The service's own lock on the data dir: LevelDB's is free for a moment as it starts."""
    with open(data_dir / LOCK_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreBusy(database) from None
        yield


@contextmanager
def _review_lanes(settings: Settings) -> Iterator[Lanes]:
    """The store to review: PostgreSQL read while the service runs, by its own client; a
    LevelDB data dir only while no service holds it (`decision_review.open_store`)."""
    with decision_review.open_store(configured_store(settings), settings.data_dir) as lanes:
        yield lanes


def _revisions(settings: Settings, tenant: str | None) -> int:
    """`decisions revisions`: the summaries the journal keeps, by chain (tenant)."""
    with _review_lanes(settings) as lanes:
        print(_revision_listing(lanes, tenant))
    return 0


def _revision_listing(lanes: Lanes, tenant: str | None) -> str:
    chains = chain_names(lanes) if tenant is None else [chain_name(tenant)]
    listing = {
        name: [summary.model_dump() for summary in revisions.revisions(lanes, name)]
        for name in chains
    }
    return json.dumps({"complete": revisions.complete(lanes), "tenants": listing})


def _review(settings: Settings, args: argparse.Namespace) -> int:
    data_dir = settings.data_dir
    if args.review == "revisions":
        return _revisions(settings, args.tenant)
    if args.review == "verify":
        if args.all_tenants:
            with _review_lanes(settings) as lanes:
                verifier = decision_review.anchor_verifier(data_dir, args.public_key)
                every = decision_review.every_chain_verified(lanes, verifier)
            print(every.model_dump_json())
            return 0 if every.ok else 1
        result = decision_review.verify(data_dir, args.checkpoint, args.public_key, args.tenant)
        print(result.model_dump_json())
        return 0 if result.ok else 1
    if args.review == "public-key":
        print(decision_review.public_key(data_dir).decode("ascii"), end="")
    elif args.review == "verifier":
        sys.stdout.flush()
        sys.stdout.buffer.write(VERIFIER.read_bytes())  # byte for byte what bundles ship
    elif args.review == "checkpoint":
        print(decision_review.checkpoint(data_dir, args.tenant).model_dump_json())
    elif args.review == "bundle":
        made = decision_review.bundle(data_dir, args.out, args.tenant, args.since, args.until)
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
        with _review_lanes(settings) as lanes:
            entry = decision_review.record_loss(lanes, data_dir, args.tenant)
        print(canonical_json(entry).decode())
    elif args.review == "prune":
        print(json.dumps({"pruned": decision_review.prune(data_dir, args.older_than_days)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
