"""`sessionstate secrets`: `init` makes a deployment's secrets once, into a folder every
replica reads (`SESSIONSTATE_SECRETS_DIR`); `export` prints the JWT secret and the digest key
as env lines, to move a data dir to compose."""

from __future__ import annotations

import argparse
from pathlib import Path

from service.config.secret_values import secret_lines
from service.config.secrets_init import provision
from service.config.settings import Settings

NAME = "secrets"


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    secrets = commands.add_parser(
        "secrets",
        help="make a deployment's secrets once (init), or print a data dir's as env lines (export)",
    )
    secret_commands = secrets.add_subparsers(dest="secrets", required=True)
    init = secret_commands.add_parser(
        "init",
        help="write the secrets every replica shares into a new folder, once",
        description="Writes jwt.secret, digest.key, checkpoint.key and token-signing-key.pem "
        "(each mode 0600) into DIR (made mode 0700), refusing a folder that holds any of them "
        "already. Every replica and every command started with SESSIONSTATE_SECRETS_DIR=DIR "
        "reads them from there. Prints one JSON line: the files and the key ids (no value).",
    )
    init.add_argument("--out", type=Path, required=True, metavar="DIR")
    secret_commands.add_parser(
        "export",
        help="print the secrets themselves, as env lines for compose",
        description="Prints SESSIONSTATE_JWT_SECRET=hex:… and SESSIONSTATE_DIGEST_KEY=hex:… "
        "lines: the secrets themselves, on stdout. That is its purpose; nothing is logged. "
        "They are those variables' when set, else SESSIONSTATE_SECRETS_DIR's files, else the "
        "data dir's. Redirect them into an env file that only its owner can read (umask 077); "
        "tokens and digests stay valid when a service reads them from there.",
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.secrets == "init":
        print(provision(args.out).model_dump_json())
        return 0
    for line in secret_lines(settings):
        print(line)
    return 0
