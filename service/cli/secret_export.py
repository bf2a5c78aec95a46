"""`sessionstate secrets export`: the JWT secret and the digest key as env lines, to move a
data dir to compose."""

from __future__ import annotations

import argparse

from service.config.secret_values import secret_lines
from service.config.settings import Settings

NAME = "secrets"


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def run(settings: Settings, args: argparse.Namespace) -> int:
    for line in secret_lines(settings):
        print(line)
    return 0
