"""The admission check that a policy set leaves `sessionstate.batch` to the service.

Grouped decisions (`service.policy.grouping`) are asked of `sessionstate.batch`, a
module the service adds to every bundle it serves or signs (`service.policy.batch`).
A policy file of the set's own in that package would decide grouped requests
otherwise than the packages the admission checks and invariants judge, so a set
with one is refused (`policy_package_reserved`), whatever the module says; only the
service's own module, at its own path, is let through (a signed bundle carries it).
"""

from __future__ import annotations

import re

from service.policy.admission_check import Candidate, Refusal
from service.policy.batch import LIVE_BATCH_MODULE_PATH, LIVE_BATCH_PACKAGE, live_batch_module

RESERVED = "policy_package_reserved"
_PACKAGE = re.compile(
    rb"^[ \t]*package[ \t]+sessionstate\.%s(?![A-Za-z0-9_])" % LIVE_BATCH_PACKAGE.encode(),
    re.MULTILINE,
)


def batch_reserved(candidate: Candidate) -> list[Refusal]:
    own = live_batch_module()
    return [
        Refusal(
            RESERVED,
            f"{name} declares package sessionstate.{LIVE_BATCH_PACKAGE} (or one under it), "
            "which is the service's own (grouped decisions); move it to another package",
        )
        for name, content in candidate.bundle.files
        if name.endswith(".rego")
        and _PACKAGE.search(content)
        and not (name == LIVE_BATCH_MODULE_PATH and content == own)
    ]
