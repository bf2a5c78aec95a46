"""What the parent of workers publishes of its policies, as each worker reads it back
(`service.policy.health`); end to end in tests/runtime/test_workers_as_one.py."""

from __future__ import annotations

from pathlib import Path

from service.policy.health import (
    POLICY_HEALTH_UNAVAILABLE,
    BundleHealth,
    PolicyHealth,
    publish_policy_health,
    published_policy_health,
)


def test_what_is_published_is_what_a_worker_reads(tmp_path: Path) -> None:
    health = PolicyHealth(
        source_valid=False,
        warnings=("policy_source_invalid", "policy_bundle_rejected"),
        reloads={"loaded": 2, "unchanged": 0, "invalid": 1},
        bundle=BundleHealth(rejected=1, rollback=0),
    )
    path = tmp_path / "workers" / "policy-health.json"
    publish_policy_health(path, health)
    assert published_policy_health(path) == health
    assert [entry.name for entry in path.parent.iterdir()] == [path.name]  # no partial left


def test_a_worker_that_cannot_read_it_says_so_and_claims_no_policy_state(tmp_path: Path) -> None:
    path = tmp_path / "policy-health.json"
    unknown = PolicyHealth(source_valid=None, warnings=(POLICY_HEALTH_UNAVAILABLE,))
    assert published_policy_health(path) == unknown  # not published (yet)
    path.write_text('{"source_valid": true, "reloads": {"loaded": -')  # cut short
    assert published_policy_health(path) == unknown
