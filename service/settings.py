"""Configuration: one typed object, read once from the environment (API.md's table)."""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from store.bounds import DEFAULT_TURNS_KEPT, MAX_TURNS, MIN_TURNS_KEPT

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    """Every knob of the service. Secrets left unset are generated into the data dir."""

    model_config = SettingsConfigDict(env_prefix="SESSIONSTATE_", extra="ignore", frozen=True)

    data_dir: Path = Path("./var")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    opa_url: str | None = None
    opa_token: str | None = Field(default=None, repr=False)
    durable_writes: bool = False
    jwt_secret: str | None = Field(default=None, repr=False)
    jwt_public_key_file: Path | None = None
    # Tokens that would live longer (by `exp` from now, or `exp - iat`) are refused.
    jwt_max_lifetime_seconds: int = Field(default=86_400, ge=60, le=31_536_000)
    digest_key: str | None = Field(default=None, repr=False)
    decision_retention_days: int | None = Field(default=None, ge=1, le=36_500)
    opa_timeout_ms: int = Field(default=250, ge=10, le=10_000)
    opa_bin: str | None = None
    policy_dir: Path = PROJECT_ROOT / "policies"
    # Reading requests (service.http.front): a stalled read closes the connection; a body
    # must arrive whole within its deadline; an idle kept-alive connection is closed.
    read_timeout_seconds: int = Field(default=10, ge=1, le=300)
    body_timeout_seconds: int = Field(default=30, ge=1, le=600)
    keep_alive_seconds: int = Field(default=5, ge=1, le=300)
    # Per actor (token subject and tenant), in the `limits` notation; "off" disables.
    rate_limit: str = "500/second;15000/minute"
    denial_rate_limit: str = "20/minute"
    # The window: a record keeps the newest turns; older ones go into its compacted summary.
    max_turns_kept: int = Field(default=DEFAULT_TURNS_KEPT, ge=MIN_TURNS_KEPT, le=MAX_TURNS)

    def resolved_opa_bin(self) -> str:
        """The OPA binary for the local sidecar: configured, project-built, or on PATH."""
        if self.opa_bin:
            return self.opa_bin
        built = PROJECT_ROOT / ".tools" / "bin" / "opa"
        if built.exists():
            return str(built)
        found = shutil.which("opa")
        if found is None:
            raise FileNotFoundError("no opa binary: run `make run`, or set SESSIONSTATE_OPA_BIN")
        return found
