"""The `sessionstate` command: serve, reload policies, mint tokens, review the decision log,
export the secrets, repair the store."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Protocol

from pydantic import ValidationError

import service.cli.db as db  # the module itself, not through the package: no circle
import service.cli.decision_log as decision_log
import service.cli.mint as mint
import service.cli.policy as policy
import service.cli.secret_export as secret_export
import service.cli.serve as serve
from service.config.configuration_error import ConfigurationError
from service.config.settings import Settings, setting_errors, unknown_variables
from service.decisions.migration import LegacyChainUnverified
from service.decisions.review import ReviewError
from service.impact.candidate import CandidateUnavailable
from service.policy.sidecar import SidecarError
from store.backends.contract import StoreOffline, StoreUpgradeRefused
from store.backends.postgres_schema import SchemaMismatch
from store.chain.entry import ChainCorrupt
from store.chain.signed_head import ChainUnverified
from store.embedded.integrity import StoreUnavailable


class Subcommand(Protocol):
    """A subcommand's module: its name, its arguments, and what it does with them."""

    NAME: str

    def add(self, commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...

    def run(self, settings: Settings, args: argparse.Namespace) -> int: ...


# In the order `sessionstate --help` lists them.
SUBCOMMANDS: tuple[Subcommand, ...] = (serve, policy, mint, decision_log, secret_export, db)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sessionstate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        subcommand.add(commands)
    args = parser.parse_args(argv)
    running = {subcommand.NAME: subcommand for subcommand in SUBCOMMANDS}[args.command]
    try:
        return running.run(_settings(), args)
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
