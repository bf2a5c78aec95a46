"""Configuration: one typed object, read once from the environment (docs/api.md's table).

A value that does not parse is named by its variable with the values it
accepts (`setting_errors`), and a `SESSIONSTATE_*` variable that is no setting
is named with the closest one (`unknown_variables`); neither prints a value.
"""

from __future__ import annotations

import difflib
import shutil
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Le
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.policy.coverage_gate import DEFAULT_COVERAGE_MIN
from store.record.bounds import DEFAULT_TURNS_KEPT, MAX_TURNS, MIN_TURNS_KEPT
from store.version_lane import VERSIONS_KEPT_DEFAULT, VERSIONS_KEPT_MAX

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The policy set the wheel carries (setup.py maps the checkout's policies/ onto it).
PACKAGED_POLICIES = "default_policies"
ENV_PREFIX = "SESSIONSTATE_"
LOG_ORIGIN_PATTERN = r"^[!-*,-~]{1,200}$"  # printable ASCII but space and `+`, at most 200
MAX_WITNESSES = 32  # SESSIONSTATE_LOG_WITNESSES holds at most this many
IDLE_TTL_MAX = 315_360_000  # ten years: SESSIONSTATE_STATE_IDLE_TTL_SECONDS at most
# Read by other tools of the project, not by the service: never warned about.
OTHER_TOOLS_VARIABLES = frozenset(
    {
        "SESSIONSTATE_URL",  # examples/model_service.py, the client's base URL
        "SESSIONSTATE_TOKEN",  # examples/model_service.py, a model-service token
        "SESSIONSTATE_IMAGE",  # docker-compose.yml
        "SESSIONSTATE_PUBLISH",  # docker-compose.yml
        "SESSIONSTATE_PUBLISH_2",  # docker-compose.ha.yml, the second replica
        "SESSIONSTATE_POSTGRES_PASSWORD",  # docker-compose.ha.yml
        "SESSIONSTATE_IDENTITY",  # docker-compose.ha.yml, the folder `secrets init` wrote
    }
)


def running_from_checkout() -> bool:
    """True when the code runs from the repository (`make run`, the tests, an editable
    install), false when it was installed from a wheel into site-packages."""
    return (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "policies").is_dir()


def default_policy_dir() -> Path:
    """`SESSIONSTATE_POLICY_DIR` unset: the checkout's policies/, or the wheel's copy of
    them (`service/default_policies`, package data: see setup.py)."""
    if running_from_checkout():
        return PROJECT_ROOT / "policies"
    packaged = files("service") / PACKAGED_POLICIES
    # A directory OPA's bundle can be made from, not a zip member: wheels install unpacked.
    return Path(str(packaged))


class Settings(BaseSettings):
    """Every knob of the service. Secrets left unset come from SESSIONSTATE_SECRETS_DIR, else are
    generated into the data dir."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    data_dir: Path = Path("./var")
    # The deployment's secrets, one folder provisioned once for every replica (`sessionstate
    # secrets init --out DIR`): read, never written into. Unset: the data dir's own, each
    # generated on first use. A variable naming one secret wins over its file.
    secrets_dir: Path | None = None
    # Unset: the embedded LevelDB under data_dir. A libpq connection string: PostgreSQL.
    store: str | None = Field(default=None, repr=False)  # may hold a password
    # Worker processes serving HTTP (PostgreSQL only above 1: LevelDB admits one process).
    workers: int = Field(default=1, ge=1, le=64)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    opa_url: str | None = None
    opa_token: str | None = Field(default=None, repr=False)
    durable_writes: bool = False
    jwt_secret: str | None = Field(default=None, repr=False)
    jwt_public_key_file: Path | None = None
    # Tokens that would live longer (by `exp` from now, or `exp - iat`) are refused.
    jwt_max_lifetime_seconds: int = Field(default=86_400, ge=60, le=31_536_000)
    # An identity provider: its JWKS (keys chosen by `kid`), and the `iss` and `aud` its
    # tokens (and RS256 tokens of the key file) must carry; each unset: not checked.
    jwt_jwks_url: str | None = None
    jwt_jwks_cache_seconds: int = Field(default=300, ge=1, le=86_400)
    jwt_jwks_refresh_cooldown_seconds: int = Field(default=30, ge=0, le=3_600)
    # One fetch of the JWKS, as a whole: then it has failed (service.auth.provider_keys).
    jwt_jwks_timeout_ms: int = Field(default=2_000, ge=100, le=30_000)
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    # Token exchange (`POST /v1/token`): how long an issued session token lives, the `iss`
    # and `aud` it names, and the ES256 (P-256) private key it is signed with, a PEM file;
    # unset: one generated once into the data dir (replicas on other hosts need the file).
    token_exchange_ttl_seconds: int = Field(default=900, ge=60, le=86_400)
    token_issuer: str = Field(default="sessionstate", min_length=1, max_length=256)
    token_signing_key_file: Path | None = None
    # The service's public origin, `http(s)://host[:port]`: a token request's `resource`
    # may be a session's URL under it. Unset: only a session's path is accepted.
    public_url: str | None = None
    digest_key: str | None = Field(default=None, repr=False)
    decision_retention_days: int | None = Field(default=None, ge=1, le=36_500)
    # The decision log's checkpoint notes (store.chain.log_note): the origin their lines name
    # (`<origin>/<tenant>`) and their key's name. Printable ASCII, no space, no `+`. Unset:
    # `sessionstate.local/` and 16 hex digits of the data dir's checkpoint key.
    log_origin: str | None = Field(
        default=None,
        pattern=LOG_ORIGIN_PATTERN,
        json_schema_extra={"accepts": "printable ASCII without space or `+`, 1 to 200 characters"},
    )
    # How often the background job signs a note for each chain that grew since its latest
    # one and submits it to the witnesses (service.decisions.log_checkpoints).
    log_checkpoint_seconds: int = Field(default=60, ge=1, le=86_400)
    # The C2SP tlog-witnesses that cosign each note: a JSON array of {"vkey", "url"}
    # (service.config.log_witnesses); unset: none. And how many of them a head needs.
    log_witnesses: str | None = None
    log_witness_quorum: int | None = Field(default=None, ge=1, le=MAX_WITNESSES)
    # The RFC 3161 time-stamping authority each new checkpoint note is timestamped by, its
    # http(s) URL (service.config.timestamp_authority; unset: no timestamps), and a PEM
    # file of the CA certificates its replies' signatures must chain to (unset: the
    # replies' status, digest and nonce are checked, their signature is not).
    tsa_url: str | None = Field(default=None, repr=False)
    tsa_ca_file: Path | None = None
    # The decision scrub (service.decisions.scrub): each tenant's chain walked whole at
    # least this often, in the background; 0 turns it off.
    decision_scrub_seconds: int = Field(default=86_400, ge=0, le=31_536_000)
    opa_timeout_ms: int = Field(default=250, ge=10, le=10_000)
    # How request decisions reach OPA: one kept-alive connection per thread, or
    # opa-python-client (which probes, reload checks and engine checks always use).
    opa_transport: Literal["keep-alive", "opa-python-client"] = "keep-alive"
    # Decisions asked while one is in flight share the next query (service.policy.grouping);
    # off: one query per decision. Only the keep-alive transport groups.
    opa_grouped: bool = True
    opa_bin: str | None = None
    policy_dir: Path = default_policy_dir()
    # Local sidecar: serve every edit of policy_dir that compiles, without a reload.
    watch_policies: bool = False
    # The coverage (%) each policy file's tests must reach before `policy build` signs the
    # directory, or the local sidecar serves it (start, reload): service.policy.coverage_gate.
    policy_coverage_min: int = Field(default=DEFAULT_COVERAGE_MIN, ge=0, le=100)
    # A shadow policy set decides beside the live one and decides nothing (service.policy.shadow):
    # a directory a second local sidecar serves, or an OPA of your own (the URL wins).
    shadow_policies: Path | None = None
    shadow_opa_url: str | None = None
    shadow_opa_token: str | None = Field(default=None, repr=False)
    shadow_timeout_ms: int = Field(default=50, ge=1, le=1_000)
    # Local sidecar: serve this signed bundle (`sessionstate policy build`) instead of
    # policy_dir; OPA activates it only if it verifies with the key (a PEM public key file,
    # or for HS256 a file holding the shared secret). Both or neither.
    policy_bundle: Path | None = None
    policy_verification_key: Path | None = None
    policy_verification_alg: Literal["RS256", "ES256", "HS256"] = "RS256"
    # The revision of a signed bundle to serve although it is older than the highest serial
    # activated on the deployment (or has none): a rollback on purpose (service.policy.rollback).
    policy_bundle_pin: str | None = None
    # Operators who must stand behind each new live policy revision before OPA decides with
    # it: the one who reloads it and those who approve it (service.policy.activation_hold).
    policy_activation_approvals: int = Field(default=1, ge=1, le=3)
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
    # Versions: each session keeps its newest records, the current one among them; a write
    # drops the older ones in its own batch (store.version_lane).
    state_versions_kept: int = Field(default=VERSIONS_KEPT_DEFAULT, ge=1, le=VERSIONS_KEPT_MAX)
    # Idle expiry (service.expiry): a session not written for this long is erased by the
    # sweep, an erasure receipt by `system` (reason `expired`); 0: sessions never expire.
    state_idle_ttl_seconds: int = Field(default=0, ge=0, le=IDLE_TTL_MAX)
    # How often the idle-expiry sweep runs (a bounded pass each time), when a TTL is set.
    state_expiry_sweep_seconds: int = Field(default=300, ge=1, le=86_400)

    def resolved_opa_bin(self) -> str:
        """The OPA binary for the local sidecar: configured, project-built, or on PATH."""
        if self.opa_bin:
            return self.opa_bin
        built = PROJECT_ROOT / ".tools" / "bin" / "opa"
        if running_from_checkout() and built.exists():
            return str(built)
        found = shutil.which("opa")
        if found is None:
            raise FileNotFoundError(
                "no opa binary: put `opa` on PATH or set SESSIONSTATE_OPA_BIN "
                "(in a checkout, `make run` builds one)"
            )
        return found


def variable(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def known_variables() -> frozenset[str]:
    return frozenset(variable(name) for name in Settings.model_fields)


def setting_errors(error: ValidationError) -> str:
    """Each broken setting as `SESSIONSTATE_X (rule): accepts …`, on one line."""
    broken = []
    for detail in error.errors(include_url=False, include_input=False):
        name = str(detail["loc"][0]) if detail["loc"] else ""
        text = f"{variable(name)} ({detail['type']})"
        if name in Settings.model_fields:
            text += f": accepts {accepted_values(name)}"
        broken.append(text)
    return "; ".join(broken)


def accepted_values(field_name: str) -> str:
    """What a setting accepts, from its type and bounds (no setting's value is shown)."""
    field = Settings.model_fields[field_name]
    kinds = _kinds(field.annotation)
    optional = NoneType in kinds
    bounds = {type(item): item for item in field.metadata}
    if bool in kinds:
        text = "true or false (also 1/0, yes/no, on/off)"
    elif int in kinds:
        low, high = bounds.get(Ge), bounds.get(Le)
        if isinstance(low, Ge) and isinstance(high, Le):
            text = f"a whole number from {low.ge} to {high.le}"
        else:
            text = "a whole number"
    elif Path in kinds:
        text = "a path"
    elif get_origin(field.annotation) is Literal:
        text = " or ".join(f"`{choice}`" for choice in get_args(field.annotation))
    else:
        text = "text"
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("accepts"), str):
        text = str(extra["accepts"])  # a rule the type does not say
    return text + (", or unset" if optional else "")


def _kinds(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) in (Union, UnionType):
        return get_args(annotation)
    return (annotation,)


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """`SESSIONSTATE_*` names that are no setting, each with the closest setting (or None).

    Only names are looked at: the values are never read, so they cannot be shown.
    """
    known = known_variables()
    suffixes = sorted(name.removeprefix(ENV_PREFIX) for name in known)
    unknown = []
    for name in sorted(environ):
        upper = name.upper()  # pydantic-settings reads names case-insensitively
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in OTHER_TOOLS_VARIABLES:
            continue
        # Compared without the shared prefix, which would make every name look alike.
        closest = difflib.get_close_matches(upper.removeprefix(ENV_PREFIX), suffixes, n=1)
        unknown.append((name, ENV_PREFIX + closest[0] if closest else None))
    return unknown
