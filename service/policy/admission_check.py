"""What an admission check is given and what it answers (`service.policy.admission`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.policy.bundle import PolicyBundle


@dataclass(frozen=True)
class Candidate:
    """A policy set about to be served or signed."""

    opa_bin: str
    bundle: PolicyBundle  # exactly the files OPA would be served
    root: Path  # those files written out as a bundle directory (`.manifest` too), to give OPA
    source_dir: Path | None  # the directory they were read from (tests beside); None: a file


@dataclass(frozen=True)
class Refusal:
    """Why a check refuses the set: a reason code and what is wrong, in one line."""

    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


AdmissionCheck = Callable[[Candidate], list[Refusal]]
