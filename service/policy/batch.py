"""One query that decides a batch of policy inputs, each by the package of its action.

Served beside a policy set, never part of it: by impact analysis (on the
candidate's sidecar, `service.impact.candidate`), by the admission checks
(on a scratch `opa eval`, `service.policy.admission`), and on the request path
as `sessionstate.batch` (`LIVE_BATCH_MODULE`, added to every bundle the service
serves or signs: `service.policy.bundle`; asked by `service.policy.grouping`).
One HTTP round trip or one process per decision costs far more than OPA's
evaluation does. A policy set may not define `sessionstate.batch` itself
(`service.policy.batch_reserved`).
"""

from __future__ import annotations

from typing import Any

from service.api.v1 import DECISION_PACKAGES

LIVE_BATCH_PACKAGE = "batch"  # data.sessionstate.batch.decision, the request path's
BATCH_PACKAGE = "impact_batch"  # data.sessionstate.impact_batch.decision, for impact analysis
_MODULE = """# METADATA
# title: Policy input batch
# description: Decides every input of a batch, each by the package of its action.
package sessionstate.{name}

# METADATA
# title: Batch decision
# description: By batch index, the decision of each input; an undefined one is absent.
# entrypoint: true
decision := {{sprintf("%d", [i]): d |
	some i, item in input.batch
	d := _decide(item.package, item.input)
}}
"""
_DECIDE = """
_decide(name, document) := answer if {{
	name == "{package}"
	answer := data.sessionstate.{package}.decision with input as document
}}
"""


def batch_module(name: str = BATCH_PACKAGE) -> str:
    """The Rego module of the batch query (package `sessionstate.<name>`), for every package
    the contract names."""
    packages = sorted(set(DECISION_PACKAGES.values()))
    return _MODULE.format(name=name) + "".join(
        _DECIDE.format(package=package) for package in packages
    )


def batch_document(items: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The batch query's input: (package, policy input) pairs, in order."""
    return {"batch": [{"package": package, "input": document} for package, document in items]}


def batch_answers(result: Any, count: int) -> list[Any]:
    """The batch query's result as one answer per input, in order (None: undefined)."""
    decided = result if isinstance(result, dict) else {}
    return [decided.get(str(index)) for index in range(count)]


LIVE_BATCH_MODULE_PATH = "/sessionstate/batch/batch.rego"  # where bundles carry it


def live_batch_module() -> bytes:
    """The request path's batch module, as bundles carry it."""
    return batch_module(LIVE_BATCH_PACKAGE).encode()


def encoded_batch(items: list[tuple[str, bytes]]) -> bytes:
    """`batch_document` of (package, policy input's canonical JSON) pairs, as canonical JSON,
    joined from the inputs' bytes: no input is encoded again."""
    members = b",".join(
        b'{"input":%s,"package":"%s"}' % (encoded, package.encode("ascii"))
        for package, encoded in items
    )
    return b'{"batch":[' + members + b"]}"
