"""`sessionstate serve`: start the OPA sidecar and the service (`service.runtime.process`)."""

from __future__ import annotations

import argparse

from service.cli.arguments import positive
from service.cli.walkthrough import walkthrough
from service.config.settings import Settings

NAME = "serve"


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        type=positive,
        help="HTTP worker processes (as SESSIONSTATE_WORKERS; default 1); above 1 needs "
        "SESSIONSTATE_STORE (PostgreSQL): LevelDB admits one process",
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    from service.runtime.process import serve as run_service

    if args.watch_policies:
        settings = settings.model_copy(update={"watch_policies": True})
    if args.workers is not None:
        settings = settings.model_copy(update={"workers": args.workers})
    run_service(
        settings,
        on_ready=(lambda: print(walkthrough(settings), flush=True)) if args.walkthrough else None,
    )
    return 0
