"""Configuration: one typed object, read once from the environment (API.md's table)."""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    digest_key: str | None = Field(default=None, repr=False)
    decision_retention_days: int | None = Field(default=None, ge=1, le=36_500)
    opa_timeout_ms: int = Field(default=250, ge=10, le=10_000)
    opa_bin: str | None = None
    policy_dir: Path = PROJECT_ROOT / "policies"
    # Per actor (token subject and tenant), in the `limits` notation; "off" disables.
    rate_limit: str = "500/second;15000/minute"
    denial_rate_limit: str = "20/minute"

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
