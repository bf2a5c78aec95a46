"""`sessionstate token`: mint a bearer token with the data dir's HS256 secret."""

from __future__ import annotations

import argparse
import sys

from service.auth.tokens import mint_token
from service.config.secret_values import jwt_secret
from service.config.settings import Settings

NAME = "token"
ROLES = ("model-service", "operator", "auditor")
DEFAULT_TOKEN_TTL = 3600


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def run(settings: Settings, args: argparse.Namespace) -> int:
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
