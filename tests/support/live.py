"""A live service for end-to-end tests: real HTTP, real OPA, real LevelDB.

The service runs in this process, on the front `sessionstate serve` runs
(`service.runtime.serving.serve_http`: hypercorn's event loop, the request threads), in a
thread of its own: what a test sends meets what a user's request meets."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from service.auth.tokens import mint_token
from service.config.settings import Settings
from service.context import ServiceContext, utc_now
from service.policy.sidecar import OpaSidecar
from service.runtime.serving import serve_http

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
    try:
        with _front(settings, context) as url, requests.Session() as http:
            yield LiveService(url, context, settings, http)
    finally:
        context.close()


@contextmanager
def _front(settings: Settings, context: ServiceContext) -> Iterator[str]:
    """`serve_http` on a loopback port, in a thread with its own event loop, until the block
    ends; its URL. The socket listens before the thread starts: a request sent at once
    waits in its backlog until the front accepts it."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = listener.getsockname()[1]
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def shutdown() -> None:
        await stop.wait()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve_http(settings, context, listener, shutdown=shutdown))
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    thread = threading.Thread(target=run, name=f"front-{port}", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
