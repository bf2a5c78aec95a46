"""A live service for end-to-end tests: real HTTP, real OPA, real LevelDB."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from werkzeug.serving import make_server

from service.app import create_app
from service.auth.tokens import mint_token
from service.config.settings import Settings
from service.context import ServiceContext, utc_now
from service.policy.sidecar import OpaSidecar

JWT_SECRET = "jwt-secret-for-tests-0123456789abcdef"
DIGEST_KEY = "digest-key-for-tests-0123456789abcdef"
SESSION_PATH = "/v1/tenants/{t}/workspaces/{w}/sessions/{s}"


def minted_token(
    role: str = "model-service",
    *,
    sub: str = "svc-1",
    tenant: str | None = "tenant-a",
    workspace: str | None = "ws-1",
    session: str | None = "chat-1",
    ttl: int = 600,
) -> str:
    """A token the tests' services accept (signed with JWT_SECRET), scoped to one session
    by default."""
    return mint_token(
        JWT_SECRET.encode(),
        sub=sub,
        roles=[role],
        tenant=tenant,
        workspace=workspace,
        session=session,
        ttl_seconds=ttl,
    )


@dataclass
class LiveService:
    url: str
    context: ServiceContext
    settings: Settings
    http: requests.Session

    def token(
        self,
        role: str = "model-service",
        *,
        sub: str = "svc-1",
        tenant: str | None = "tenant-a",
        workspace: str | None = "ws-1",
        session: str | None = "chat-1",
        ttl: int = 600,
    ) -> str:
        return minted_token(
            role, sub=sub, tenant=tenant, workspace=workspace, session=session, ttl=ttl
        )

    def operator(self, tenant: str = "tenant-a") -> str:
        return self.token("operator", sub="op-1", tenant=tenant, workspace=None, session=None)

    def call(
        self,
        method: str,
        path: str,
        token: str | None = None,
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        data: bytes | str | None = None,
    ) -> requests.Response:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        return self.http.request(
            method, self.url + path, json=json, data=data, headers=sent, timeout=10
        )

    def session_path(self, t: str = "tenant-a", w: str = "ws-1", s: str = "chat-1") -> str:
        return SESSION_PATH.format(t=t, w=w, s=s)

    def approve(self, *, session_id: str | None = None, ttl: int = 600) -> dict[str, Any]:
        body: dict[str, Any] = {"ttl_seconds": ttl, "reason": "tests"}
        if session_id is not None:
            body["session_id"] = session_id
        answer = self.call(
            "POST", "/v1/tenants/tenant-a/workspaces/ws-1/approvals", self.operator(), json=body
        )
        assert answer.status_code == 201, answer.text
        approval: dict[str, Any] = answer.json()["approval"]
        return approval


def service_settings(data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "durable_writes": True,
        "jwt_secret": JWT_SECRET,
        "digest_key": DIGEST_KEY,
        "opa_timeout_ms": 1000,
    }
    values.update(overrides)
    return Settings(**values)


@contextmanager
def live_service(
    sidecar: OpaSidecar,
    settings: Settings,
    *,
    clock: Callable[[], datetime] = utc_now,
    shadow: OpaSidecar | None = None,
    local_sidecar: bool = False,
) -> Iterator[LiveService]:
    """The service over HTTP in this process; with `shadow`, that OPA is its shadow policy set;
    `local_sidecar`: the service knows the sidecar's policy snapshot, as `serve` does."""
    context = ServiceContext.open(
        settings,
        opa_url=sidecar.url,
        opa_token=sidecar.token,
        clock=clock,
        policy_source=sidecar.policies if local_sidecar else None,
        shadow_url=None if shadow is None else shadow.url,
        shadow_token=None if shadow is None else shadow.token,
    )
    server = make_server("127.0.0.1", 0, create_app(context), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    http = requests.Session()
    try:
        yield LiveService(f"http://127.0.0.1:{server.server_port}", context, settings, http)
    finally:
        http.close()
        server.shutdown()
        context.close()
