"""The admission check that every decision package is defined and answers the decision schema.

Each package the contract names (`service.api.v1.DECISION_PACKAGES`) is asked, in one
scratch `opa eval` of the candidate, for its `decision` on the representative inputs of its
actions (`service.policy.samples`: every tenant the candidate's tenant settings name among
them). A decision that is undefined, or not `{"allow": boolean, "reasons": [string, ...]}`,
for any of them refuses the set (`policy_decision_undefined`), naming the package, what is
missing, and for how many inputs. An input outside those that makes a decision undefined is
found at request time instead: that request answers 503 `policy_decision_undefined`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from service.api.reasons import Reason
from service.api.v1 import DECISION_PACKAGES
from service.policy.admission_check import Candidate, Refusal
from service.policy.batch import batch_answers, batch_document, batch_module
from service.policy.samples import representative_inputs
from service.policy.scratch import EvaluationFailed, evaluate
from service.policy.tenant_settings import bundled_settings

UNDEFINED = Reason.POLICY_DECISION_UNDEFINED.value
ADMISSION_BATCH = "admission_batch"  # data.sessionstate.admission_batch.decision


def decisions_defined(candidate: Candidate) -> list[Refusal]:
    inputs = representative_inputs(settings_tenants(candidate))
    items = [(DECISION_PACKAGES[document["action"]], document) for document in inputs]
    try:
        result = evaluate(
            candidate.opa_bin,
            candidate.root,
            f"data.sessionstate.{ADMISSION_BATCH}.decision",
            batch_document(items),
            [("admission_batch.rego", batch_module(ADMISSION_BATCH))],
        )
    except EvaluationFailed as error:
        return [Refusal(UNDEFINED, f"the decisions could not be evaluated: {error}")]
    missing: defaultdict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    asked: defaultdict[str, int] = defaultdict(int)
    for (package, document), answer in zip(items, batch_answers(result, len(items)), strict=True):
        asked[package] += 1
        problem = what_is_missing(answer)
        if problem is not None:
            missing[package, problem].append(document)
    return [
        Refusal(UNDEFINED, _detail(package, problem, documents, asked[package]))
        for (package, problem), documents in sorted(missing.items())
    ]


def what_is_missing(answer: Any) -> str | None:
    """How an answer falls short of the decision schema; None when it is a decision."""
    if answer is None:
        return "`decision` is undefined"
    if not isinstance(answer, dict):
        return "`decision` is not an object"
    if not isinstance(answer.get("allow"), bool):
        return "`decision.allow` is not a boolean"
    reasons = answer.get("reasons")
    if not isinstance(reasons, list) or not all(isinstance(code, str) for code in reasons):
        return "`decision.reasons` is not an array of strings"
    return None


def _detail(package: str, problem: str, documents: list[dict[str, Any]], asked: int) -> str:
    actions = sorted({document["action"] for document in documents})
    tenants = sorted({str(document["target"]["tenant_id"]) for document in documents})
    return (
        f"sessionstate.{package}: {problem} for {len(documents)} of {asked} representative "
        f"inputs (action {', '.join(actions)}; target tenant {', '.join(tenants[:3])}"
        + (f" and {len(tenants) - 3} more" if len(tenants) > 3 else "")
        + ")"
    )


def settings_tenants(candidate: Candidate) -> list[str]:
    """The tenants the candidate's tenant settings name (none when it has none that reads)."""
    document = bundled_settings(candidate.bundle.files)
    return [] if document is None else [entry.tenant_id for entry in document.settings]
