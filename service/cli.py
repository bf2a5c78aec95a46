"""The `sessionstate` command: serve, and mint tokens with the local secret."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from service.auth import mint_token
from service.context import ConfigurationError, jwt_secret
from service.opa_sidecar import SidecarError
from service.settings import Settings
from service.walkthrough import walkthrough

ROLES = ("model-service", "operator", "auditor")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sessionstate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="start the OPA sidecar and the service")
    serve.add_argument(
        "--walkthrough", action="store_true", help="print a ready-to-paste walk-through once up"
    )

    token = commands.add_parser("token", help="mint a bearer token with the local HS256 secret")
    token.add_argument("--sub", required=True, help="the actor id")
    token.add_argument("--role", action="append", required=True, choices=ROLES, dest="roles")
    token.add_argument("--tenant")
    token.add_argument("--workspace")
    token.add_argument("--session")
    token.add_argument("--ttl", type=int, default=3600, help="seconds (default 3600)")

    args = parser.parse_args(argv)
    try:
        settings = Settings()
        if args.command == "token":
            print(
                mint_token(
                    jwt_secret(settings),
                    sub=args.sub,
                    roles=args.roles,
                    tenant=args.tenant,
                    workspace=args.workspace,
                    session=args.session,
                    ttl_seconds=args.ttl,
                )
            )
            return 0
        from service.serve import serve as run_service

        run_service(
            settings,
            on_ready=(lambda: print(walkthrough(settings), flush=True))
            if args.walkthrough
            else None,
        )
        return 0
    except (ConfigurationError, SidecarError, ValueError, FileNotFoundError) as error:
        print(f"sessionstate: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
