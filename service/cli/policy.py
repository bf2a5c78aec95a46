"""`sessionstate policy`: the policies the running service decides with: `reload` and
`approve` them, `build` a signed bundle, and weigh a candidate's `impact` on the logged
decisions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jwt

from service.auth.tokens import mint_token
from service.cli.arguments import not_negative, operator_id, positive, revision
from service.config.secret_values import jwt_secret
from service.config.settings import Settings
from service.config.store import configured_store
from service.decisions import review as decision_review
from service.decisions.review import ReviewError
from service.impact.report import render
from service.impact.run import analyse
from service.policy.coverage_gate import CoverageGate
from service.policy.engine_checks import local_opa_bin
from service.policy.reload import PolicyStatus, request_reload
from service.policy.signed_bundle import SIGNING_ALGS, build_signed_bundle
from service.policy.source import PolicyRefused, PolicyTestsFailed
from store.scope import is_scope_id

NAME = "policy"
RELOAD_TOKEN_TTL = 120  # `policy reload --operator`: lives as long as a reload takes


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        "--timeout", type=positive, default=30, help="seconds to wait for the outcome (30)"
    )
    reload.add_argument(
        "--skip-tests",
        action="store_true",
        help="serve it even if its tests fail or cover it below SESSIONSTATE_POLICY_COVERAGE_MIN "
        "(this reload only; logged as policy_tests_skipped with the operator); needs --operator "
        "or --token-file",
    )
    reload.set_defaults(refuse=reload.error)
    who = reload.add_mutually_exclusive_group()
    who.add_argument(
        "--operator",
        type=operator_id,
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
        "--examples", type=not_negative, default=10, help="changed decisions shown (default 10)"
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.policy == "build":
        return _policy_build(settings, args)
    if args.policy == "impact":
        return _impact(settings, args)
    if args.policy == "approve":
        approving = _operator_token(settings, args.operator, args.token_file)
        status = request_reload(settings.data_dir, args.timeout, approving, approve=args.revision)
        print(status.model_dump_json())
        return _reload_exit(status)
    operator_token = _operator_token(settings, args.operator, args.token_file)
    if args.skip_tests and operator_token is None:
        args.refuse("--skip-tests needs --operator or --token-file")
    skips = _named_operator(args.operator, operator_token) if args.skip_tests else None
    status = request_reload(settings.data_dir, args.timeout, operator_token, skip_tests_by=skips)
    print(status.model_dump_json())
    return _reload_exit(status)


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
        "revision", type=revision, help="the revision (`pending_revision` of the reload)"
    )
    approve.add_argument(
        "--timeout", type=positive, default=30, help="seconds to wait for the outcome (30)"
    )
    who = approve.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--operator",
        type=operator_id,
        help="who approves: a short-lived operator token for this id is minted with the data "
        "dir's HS256 secret (as `sessionstate token` does)",
    )
    who.add_argument(
        "--token-file",
        type=Path,
        help="who approves: a file holding your operator bearer token, which the service verifies",
    )


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
        type=positive,
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
            tests=CoverageGate(opa_bin, settings.policy_coverage_min, memo=False),
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
