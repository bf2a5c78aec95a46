"""The ready-to-paste walk-through `make run` prints once the service is up."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from service.config.settings import Settings, running_from_checkout

EXAMPLE_STATE = (
    '{"runtime_profile": {"task_profile": "coding", "model_id": "qwen2.5-coder:7b", '
    '"tokenizer": "qwen2", "context_window": 8192, "max_tokens": 512, "streaming": true}, '
    '"memory_anchors": [{"anchor_id": "memory:active", "evidence": "prefers Rust"}], '
    '"gene_anchors": [{"anchor_id": "gene:rust-coding", "evidence": "rust coding gene"}], '
    '"routing_evidence": [{"anchor_id": "route:coder", "evidence": "coding intent"}], '
    '"turns": [{"turn_id": "turn-1", "role": "user", "payload": "why does the borrow checker complain?"}]}'
)


def walkthrough(settings: Settings) -> str:
    base = f"http://{settings.host}:{settings.port}"
    session = f"{base}/v1/tenants/acme/workspaces/support/sessions/chat-1"
    writes = (
        "on" if settings.durable_writes else "off (SESSIONSTATE_DURABLE_WRITES=true turns them on)"
    )
    cli = _cli()
    return f"""
sessionstate is up on {base}  (OPA decides every request; durable writes: {writes})
Paste these into another shell, from this directory:

{_environment(settings)}  # 1. Tokens for a model service scoped to one session, and for an operator of its tenant
  SVC=$({cli} token --sub demo-model --role model-service --tenant acme --workspace support --session chat-1)
  OP=$({cli} token --sub demo-operator --role operator --tenant acme)
  STATE='{EXAMPLE_STATE}'

  # 2. Preview the sanitized record: raw text comes back only as hmac-sha256 digests
  curl -s -X POST {session}/state/preview -H "Authorization: Bearer $SVC" -H 'Content-Type: application/json' -d "$STATE"

  # 3. An operator approves durable writes for the workspace for 10 minutes
  curl -s -X POST {base}/v1/tenants/acme/workspaces/support/approvals -H "Authorization: Bearer $OP" -H 'Content-Type: application/json' -d '{{"ttl_seconds": 600, "reason": "walkthrough"}}'

  # 4. Write it (201; 403 session_state_durable_writes_disabled while durable writes are off)
  curl -s -i -X PUT {session}/state -H "Authorization: Bearer $SVC" -H 'Content-Type: application/json' -d "$STATE"

  # 5. Read it back, and preview the replay inputs (404 session_state_not_found until a write succeeded)
  curl -s {session}/state -H "Authorization: Bearer $SVC"
  curl -s -X POST {session}/replay-preview -H "Authorization: Bearer $SVC" -H 'Content-Type: application/json' -d '{{"max_inputs": 8}}'

  # Every answer carries the policy `decision`. API: {base}/docs  Metrics: {base}/metrics
  # Stop with Ctrl-C (SIGINT) or SIGTERM: the OPA sidecar stops with the service.
"""


def _cli() -> str:
    """How the reader's shell runs `sessionstate`: the checkout's venv (`make run`), or for
    an installed wheel the script beside this interpreter (by name when PATH finds it)."""
    if running_from_checkout():
        return ".venv/bin/sessionstate"
    script = Path(sys.executable).parent / "sessionstate"
    if not script.exists() or shutil.which("sessionstate") == str(script):
        return "sessionstate"
    return shlex.quote(str(script))


def _environment(settings: Settings) -> str:
    """The settings `sessionstate token` must share with this service, where not the defaults.

    A new shell has none of the service's environment: without these lines its
    tokens would be signed with another data dir's secret (401), or live longer
    than this service accepts. A secret given in the environment is not printed.
    """
    defaults = Settings.model_fields
    exports = []
    data_dir = Path(settings.data_dir).resolve()
    if data_dir != Path(defaults["data_dir"].default).resolve():
        exports.append(f"SESSIONSTATE_DATA_DIR={shlex.quote(str(data_dir))}")
    lifetime = settings.jwt_max_lifetime_seconds
    if lifetime != defaults["jwt_max_lifetime_seconds"].default:
        exports.append(f"SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS={lifetime}")
    lines = []
    if exports:
        lines += [
            "  # 0. This service's settings that the commands below need (they are not the defaults)",
            f"  export {' '.join(exports)}",
        ]
    if settings.jwt_secret is not None:
        lines += [
            "  # The service's JWT secret comes from SESSIONSTATE_JWT_SECRET (not printed here):",
            "  # set it in this shell too, or its tokens answer 401 token_invalid.",
        ]
    return "".join(f"{line}\n" for line in lines) + ("\n" if lines else "")
