"""The admission check that the deployment's invariants hold for the candidate.

An invariant is a Rego module of `invariants/` beside the policies (never served:
`service.policy.bundle`), package `sessionstate.invariants.<its file's name>`, whose
`violation` is true for an input the decisions must not allow (it reads them itself, e.g.
`data.sessionstate.read.decision`). A directory's own invariants are checked, and beside them
every shipped one (the default policies', `default_policy_dir`) it does not hold word for
word, so that deleting or editing `invariants/` cannot switch one off; a signed bundle,
which carries none, is checked against the shipped ones.

Hypothesis generates `MAX_EXAMPLES` inputs from the input models (`service.policy.generated`),
the same ones every time for the same candidate (derandomized); beside them go the scope
crossings built on purpose (`service.policy.crossings`: every action, every scope id the
candidate names, actors of each role from the target's tenant and another), and one
scratch `opa eval` asks every invariant of each. An invariant violated refuses the set
(`policy_invariant_violated`), naming it and the smallest counterexample hypothesis shrinks
to (one `opa eval` per step tried, at most `MAX_SHRINK_EVALUATIONS`). Sampling proves
nothing: a counterexample hypothesis does not reach is missed.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from service.config.settings import default_policy_dir
from service.policy.admission_check import Candidate, Refusal
from service.policy.bundle import INVARIANTS_DIR
from service.policy.crossings import scope_crossings
from service.policy.defined import settings_tenants
from service.policy.generated import policy_inputs, scope_literals
from service.policy.scratch import EvaluationFailed, evaluate

VIOLATED = "policy_invariant_violated"
INVARIANTS_PACKAGE = "sessionstate.invariants"
SHIPPED = "shipped_"  # the name a shipped invariant is checked under beside a directory's
# The shipped invariants, pinned by the sha256 of their text: in a checkout the default
# policies are a directory anyone editing the policies can change, so a shipped invariant
# deleted or edited there refuses every set until this release's code says otherwise
# (tests/policy/test_policy_invariants.py holds these to the files).
SHIPPED_DIGESTS = {
    "no_cross_session_read": "812d79de0d1628111ae433a3497392400255568a78cde5ea319eded498285d81",
    "no_cross_tenant_allow": "0e1605c3fadd0b32afd01a889d5d956cf83306e82c184034c0d4e3c08100ed73",
    "no_write_without_approval": "077b1ad0ab8acaa3553fab1807694c5585c340e8e68d155950b45751c6ba17cc",
}
MAX_EXAMPLES = 200
MAX_SHRINK_EVALUATIONS = 150
_QUERY = "data.sessionstate.invariant_batch.violations"
_BATCH = """package sessionstate.invariant_batch

violations := {sprintf("%d", [i]): names |
	some i, document in input.batch
	names := [name |
		some name in input.invariants
		data.sessionstate.invariants[name].violation with input as document
	]
}
"""


def invariants_hold(candidate: Candidate) -> list[Refusal]:
    tampered = shipped_tampered()
    if tampered:
        return tampered
    modules = invariant_modules(candidate.source_dir)
    if not modules:
        return []
    names = [name for name, _ in modules]
    files = [(f"invariant_{name}.rego", text) for name, text in modules]
    ids = scope_literals(
        [content for _, content in candidate.bundle.files] + [text.encode() for _, text in modules]
    )
    strategy = policy_inputs([*ids, *settings_tenants(candidate)])

    def violated(documents: list[dict[str, Any]]) -> list[list[str]]:
        result = evaluate(
            candidate.opa_bin,
            candidate.root,
            _QUERY,
            {"batch": documents, "invariants": names},
            [*files, ("invariant_batch.rego", _BATCH)],
        )
        decided = result if isinstance(result, dict) else {}
        return [list(decided.get(str(index), [])) for index in range(len(documents))]

    try:
        with _private_storage():
            collected = _Collector()
            _search(strategy, collected, MAX_EXAMPLES)
            collected.documents += scope_crossings(ids, settings_tenants(candidate))
            verdicts = violated(collected.documents)
            return [
                Refusal(
                    VIOLATED, _detail(name, _shrunk(strategy, name, collected, verdicts, violated))
                )
                for name in names
                if any(name in found for found in verdicts)
            ]
    except EvaluationFailed as error:
        return [Refusal(VIOLATED, f"the invariants could not be evaluated: {error}")]


def invariant_modules(source_dir: Path | None) -> list[tuple[str, str]]:
    """(name, Rego) of each invariant a set from `source_dir` is checked against: those
    beside it, sorted by name, then each shipped one (the default policies') it does not
    hold word for word, as `shipped_<name>`: a directory adds invariants, never removes
    or weakens the shipped ones."""
    own = _modules_in(source_dir if source_dir is not None else default_policy_dir())
    texts = set(own.values())
    shipped = [
        (SHIPPED + name, _renamed(text, name, SHIPPED + name))
        for name, text in _modules_in(default_policy_dir()).items()
        if text not in texts
    ]
    return [*own.items(), *shipped]


def shipped_tampered() -> list[Refusal]:
    """A refusal for each shipped invariant missing from the default policies, or not the
    text this release pinned."""
    directory = default_policy_dir() / INVARIANTS_DIR
    found = _modules_in(default_policy_dir())
    return [
        Refusal(
            VIOLATED,
            f"the shipped invariant {INVARIANTS_PACKAGE}.{name} is missing from {directory} or "
            "is not the text this release ships: restore it (git checkout, or reinstall)",
        )
        for name, digest in SHIPPED_DIGESTS.items()
        if name not in found or hashlib.sha256(found[name].encode()).hexdigest() != digest
    ]


def _modules_in(policy_dir: Path) -> dict[str, str]:
    directory = policy_dir / INVARIANTS_DIR
    if not directory.is_dir():
        return {}
    return {
        path.stem: path.read_text()
        for path in sorted(directory.glob("*.rego"))
        if path.is_file() and not path.name.endswith("_test.rego")
    }


def _renamed(text: str, name: str, new_name: str) -> str:
    """The module in a package of its own: beside an edited copy of the same package."""
    return text.replace(
        f"package {INVARIANTS_PACKAGE}.{name}\n", f"package {INVARIANTS_PACKAGE}.{new_name}\n", 1
    )


@contextmanager
def _private_storage() -> Iterator[None]:
    """Hypothesis's files (its cache of constants) in a scratch directory, not in the
    service's working directory (`.hypothesis/`); its default again afterwards."""
    with tempfile.TemporaryDirectory(prefix="sessionstate-hypothesis-") as home:
        set_hypothesis_home_dir(home)
        try:
            yield
        finally:
            set_hypothesis_home_dir(None)


class _Collector:
    """A probe that keeps every input it is given and finds none violating."""

    def __init__(self) -> None:
        self.documents: list[dict[str, Any]] = []

    def __call__(self, document: dict[str, Any]) -> bool:
        self.documents.append(document)
        return False


class _Found(Exception):
    """Raised by the search when the probe holds: not an error."""


def _search(
    strategy: st.SearchStrategy[dict[str, Any]],
    probe: Callable[[dict[str, Any]], bool],
    examples: int,
    *,
    shrink: bool = False,
) -> dict[str, Any] | None:
    """The (shrunk) input the probe holds true, or None. Derandomized: the same strategy
    yields the same inputs in the same order on every call."""
    found: list[dict[str, Any]] = []

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
    )
    @given(strategy)
    def run(document: dict[str, Any]) -> None:
        if probe(document):
            found.append(document)
            raise _Found

    try:
        run()
    except _Found:
        return found[-1]
    return None


def _shrunk(
    strategy: st.SearchStrategy[dict[str, Any]],
    name: str,
    collected: _Collector,
    verdicts: list[list[str]],
    violated: Callable[[list[dict[str, Any]]], list[list[str]]],
) -> dict[str, Any]:
    """The smallest input hypothesis finds that violates the invariant `name`."""
    known = {
        _key(document): name in found
        for document, found in zip(collected.documents, verdicts, strict=True)
    }
    budget = [MAX_SHRINK_EVALUATIONS]

    def probe(document: dict[str, Any]) -> bool:
        key = _key(document)
        if key not in known:
            if budget[0] <= 0:
                return False
            budget[0] -= 1
            known[key] = name in violated([document])[0]
        return known[key]

    first = next(
        document
        for document, found in zip(collected.documents, verdicts, strict=True)
        if name in found
    )
    return _search(strategy, probe, MAX_EXAMPLES, shrink=True) or first


def _key(document: dict[str, Any]) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def _detail(name: str, document: dict[str, Any]) -> str:
    """The invariant and its counterexample, in one line (generated ids and flags only)."""
    shown = {key: value for key, value in document.items() if value is not None}
    return f"sessionstate.invariants.{name} is violated by {_key(shown)}"
