"""Admission: what a policy set must pass before it is served or signed.

Every policy set is admitted before it is served: at start, at a reload (`sessionstate
policy reload`, SIGHUP, the watcher of `--watch-policies`), at a signed bundle's reload,
for the shadow set and for an impact candidate (`service.policy.source`,
`service.policy.signed_bundle`), and before `sessionstate policy build` signs one. A set
that compiles but fails a check is refused as one that does not compile is: the last good
set keeps deciding, and the refusal's reason codes go to the reload's outcome, `/readyz` and
the log.

A check is a function of the `Candidate` that returns its `Refusal`s (none: it passes). To
add one, write it in a module of its own and append it to `CHECKS`. An admission is
remembered, keyed by all it depends on (`service.policy.admission_memo`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from service.policy.admission_check import AdmissionCheck, Candidate, Refusal
from service.policy.admission_memo import admission_key, remember, remembered
from service.policy.batch_reserved import batch_reserved
from service.policy.bundle import PolicyBundle
from service.policy.defined import decisions_defined
from service.policy.invariants import invariant_modules, invariants_hold

CHECKS: list[AdmissionCheck] = [
    batch_reserved,  # `sessionstate.batch` is the service's own
    decisions_defined,  # every decision package defined, of the decision schema
    invariants_hold,  # the deployment's invariants, on generated inputs
]


def admit(
    opa_bin: str,
    bundle: PolicyBundle,
    source_dir: Path | None = None,
    *,
    memo: bool = True,
) -> list[Refusal]:
    """Every check's refusals of the bundle (read from `source_dir`, if from a directory);
    a set admitted before, the same in every respect, is not checked again
    (`service.policy.admission_memo`), unless `memo` is false (`policy build`: what is
    signed is checked every time, whatever a cache file says)."""
    key = admission_key(bundle.revision, invariant_modules(source_dir), opa_bin)
    if memo and remembered(key):
        return []
    with tempfile.TemporaryDirectory(prefix="sessionstate-policy-admission-") as tmp:
        root = Path(tmp) / "bundle"
        root.mkdir()
        bundle.write_to(root)
        candidate = Candidate(opa_bin, bundle, root, source_dir)
        refusals = [refusal for check in CHECKS for refusal in check(candidate)]
    if not refusals:
        remember(key)
    return refusals
