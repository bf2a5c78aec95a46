"""The argument types the subcommands share: counts, operator ids, policy revisions."""

from __future__ import annotations

import argparse
import re

from service.policy.reload import REVISION_PATTERN
from store.scope import is_scope_id


def operator_id(text: str) -> str:
    if not is_scope_id(text):
        raise argparse.ArgumentTypeError("must be an id: letters, digits, '.', '_', '-'")
    return text


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def not_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def revision(value: str) -> str:
    if re.fullmatch(REVISION_PATTERN, value) is None:
        raise argparse.ArgumentTypeError("not a policy revision (letters, digits, ':._-')")
    return value
