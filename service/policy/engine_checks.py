"""What `sessionstate serve` checks of its policy engine before it serves anything.

Each failure is a `ConfigurationError` with one line naming the variable to
fix, so a start that cannot work stops at once instead of waiting out OPA's
start-up timeout or answering every request with a 503.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from service.config.configuration_error import ConfigurationError
from service.config.settings import Settings
from service.policy.client import PolicyClient

REVISION = re.compile(r"sha256:[0-9a-f]{64}")  # a policy revision (service.policy.bundle)


def local_opa_bin(settings: Settings) -> str:
    """The OPA binary the sidecar will run, which must exist and be executable."""
    if settings.opa_bin:
        found = shutil.which(settings.opa_bin)
        if found is None or not Path(found).is_file():
            raise ConfigurationError(
                f"SESSIONSTATE_OPA_BIN names no executable OPA binary: {settings.opa_bin}"
            )
        return found
    try:
        opa = settings.resolved_opa_bin()
    except FileNotFoundError:
        raise ConfigurationError(
            "no OPA binary: put `opa` on PATH or set SESSIONSTATE_OPA_BIN "
            "(in a checkout, `make run` builds the pinned one)"
        ) from None
    if not os.access(opa, os.X_OK):
        raise ConfigurationError(
            f"the OPA binary {opa} is not executable: set SESSIONSTATE_OPA_BIN"
        )
    return opa


def local_policy_dir(settings: Settings) -> Path:
    """The policy directory the sidecar will serve, which must be a directory."""
    if not settings.policy_dir.is_dir():
        raise ConfigurationError(
            f"SESSIONSTATE_POLICY_DIR is not a directory: {settings.policy_dir}"
        )
    return settings.policy_dir


def local_shadow_dir(settings: Settings) -> Path | None:
    """The shadow policy directory a second local sidecar will serve, if one is wanted."""
    if settings.shadow_policies is None or settings.shadow_opa_url is not None:
        return None
    if not settings.shadow_policies.is_dir():
        raise ConfigurationError(
            f"SESSIONSTATE_SHADOW_POLICIES is not a directory: {settings.shadow_policies}"
        )
    return settings.shadow_policies


def external_opa_accepts_token(settings: Settings) -> None:
    """An OPA at SESSIONSTATE_OPA_URL that refuses the service's token stops the start.

    An OPA that does not answer yet is no reason to stop: it may come up later,
    and `/readyz` says `opa_unreachable` meanwhile. A refusal will not pass.
    """
    if settings.opa_url is None:
        return
    client = PolicyClient(
        settings.opa_url, settings.opa_token, timeout=max(settings.opa_timeout_ms / 1000, 2.0)
    )
    try:
        refused = client.probe().engine_refused
    finally:
        client.close()
    if refused:
        sent = "the service's token" if settings.opa_token else "requests without a token"
        raise ConfigurationError(
            f"the OPA at SESSIONSTATE_OPA_URL refuses {sent} (401/403): set "
            "SESSIONSTATE_OPA_TOKEN to the token its system.authz admits (the "
            "SESSIONSTATE_OPA_TOKEN in the OPA process's environment)"
        )


def local_signed_bundle(settings: Settings) -> tuple[Path, Path] | None:
    """The signed bundle and its verification key, both readable files; None when unset."""
    bundle, key = settings.policy_bundle, settings.policy_verification_key
    pin = settings.policy_bundle_pin
    if pin is not None and (bundle is None or not REVISION.fullmatch(pin)):
        raise ConfigurationError(
            "SESSIONSTATE_POLICY_BUNDLE_PIN names the revision of a signed bundle "
            "(SESSIONSTATE_POLICY_BUNDLE) to serve although it is older: `sha256:` and 64 hex "
            "digits, as `sessionstate policy build` prints it"
        )
    if bundle is None and key is None:
        return None
    if settings.opa_url is not None:
        raise ConfigurationError(
            "SESSIONSTATE_POLICY_BUNDLE and SESSIONSTATE_POLICY_VERIFICATION_KEY are for the "
            "local sidecar; the OPA at SESSIONSTATE_OPA_URL verifies its own bundle "
            "(docs/deployment.md: its --verification-key)"
        )
    if bundle is None:
        raise ConfigurationError(
            "SESSIONSTATE_POLICY_VERIFICATION_KEY is set but SESSIONSTATE_POLICY_BUNDLE is not: "
            "name the signed bundle (`sessionstate policy build`) the key verifies"
        )
    if key is None:
        raise ConfigurationError(
            "SESSIONSTATE_POLICY_BUNDLE is set but SESSIONSTATE_POLICY_VERIFICATION_KEY is not: "
            "a bundle is served only with the key that verifies its signature"
        )
    for name, path in (
        ("SESSIONSTATE_POLICY_BUNDLE", bundle),
        ("SESSIONSTATE_POLICY_VERIFICATION_KEY", key),
    ):
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ConfigurationError(f"{name} names no readable file: {path}")
    return bundle, key
