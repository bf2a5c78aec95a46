"""Schemathesis drives generated requests from the OpenAPI document at the live service.

No 5xx, every answer documented, every body matching its schema, every
schema-invalid request refused. A schema-valid request may be refused only for
a rule JSON Schema cannot state (`RULES_BEYOND_SCHEMA`).
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis
from hypothesis import settings
from schemathesis.specs.openapi.checks import (
    missing_required_header,
    negative_data_rejection,
    positive_data_acceptance,
    unsupported_method,
)

from service.api.openapi import openapi_document
from service.api.v1 import EXCHANGE
from tests.support.live import LiveService

schema = schemathesis.openapi.from_dict(openapi_document())

# Rules JSON Schema cannot state (across fields, or about tokens the service issued);
# the schema says them in words.
RULES_BEYOND_SCHEMA = (
    "max_tokens_exceeds_context_window",
    "duplicate_id_conflict",
    "invalid_cursor",
)


def _refused_beyond_schema(response: Any) -> bool:
    if response.status_code != 422:
        return False
    rules = {error["rule"] for error in response.json().get("errors", [])}
    return bool(rules) and rules <= set(RULES_BEYOND_SCHEMA)


@schema.parametrize()
@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "30")))
def test_the_api_keeps_its_contract_under_generated_input(case: Any, service: LiveService) -> None:
    token = service.operator() if "approvals" in case.path else service.token()
    response = case.call(base_url=service.url, headers={"Authorization": f"Bearer {token}"})
    excluded = [positive_data_acceptance] if _refused_beyond_schema(response) else []
    if case.path == EXCHANGE and response.status_code == 400:
        # A generated subject token never verifies, nor does a generated resource name a
        # session: rules beyond schema. The answer must still match its schema.
        excluded.append(positive_data_acceptance)
    if response.status_code == 413:
        # Refused for its size before anything parsed it; schemathesis does not count 413 as refusal.
        excluded.append(negative_data_rejection)
    if response.status_code == 428:
        # A rewind without its required If-Match: RFC 6585's status for a missing
        # precondition, which schemathesis does not count among refusals.
        excluded.append(missing_required_header)
    if response.status_code == 400 and _reason(response) == "unknown_method":
        # A method the service serves on no path (TRACE, PATCH) is refused by the front, before
        # any route, as docs/api.md says: 400 `unknown_method`, not a route's 405.
        excluded.append(unsupported_method)
    case.validate_response(response, excluded_checks=excluded)


def _reason(response: Any) -> str | None:
    try:
        reason = response.json().get("reason")
    except ValueError:
        return None
    return reason if isinstance(reason, str) else None
