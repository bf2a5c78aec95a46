"""The packages of the distribution; the metadata is pyproject.toml's.

The wheel carries the default policy set as `service/default_policies`, mapped from
the checkout's `policies/`: what the local OPA sidecar serves (every non-test `.rego`
and the tenant settings `data.json`, `service.policy.bundle.policy_files`), the tests
that must pass before it is served (`service.policy.coverage_gate`), the bundle
manifest and the input schemas. So `sessionstate serve` installed from a wheel finds
its policies without a checkout (`service.config.settings.default_policy_dir`).
"""

from setuptools import find_namespace_packages, setup

POLICIES = "service.default_policies"


def data_packages(root: str, where: str) -> list[str]:
    """`root` and every directory below `where` as its package (they hold data only)."""
    return [root, *(f"{root}.{name}" for name in find_namespace_packages(where=where))]


setup(
    packages=[
        *find_namespace_packages(
            include=["store", "store.*", "service", "service.*"], exclude=["*.__pycache__"]
        ),
        *data_packages(POLICIES, "policies"),
    ],
    package_dir={POLICIES: "policies"},
    package_data={
        "service.templates": ["**/*"],
        POLICIES: [".manifest", "**/*.rego", "**/data.json", "schemas/**/*.json"],
    },
)
